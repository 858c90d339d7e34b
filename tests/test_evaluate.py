"""``rlpipe eval`` (rlpipe.trainer.evaluate): seed 001's ``evaluate_vllm`` on a micro model.

The model is the conftest micro TransformerLM with a 512-token context (the ``tiny_base`` fixture's
128 tokens cannot hold the r1_zero prompt, ~384 tokens with the story tokenizer), untrained: its
responses are noise, so every real generation lands in category (3). The categorisation itself is
checked on hand-made responses graded by the real r1_zero reward, and the counting end to end with
the sampler replaced by a stub that returns hand-made responses.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from rlpipe.config import load_config
from rlpipe.contract import (
    EVAL_CATEGORIES,
    EVAL_COLUMNS,
    EVAL_FILES,
    EVAL_FLOAT_COLUMNS,
    EVAL_INT_COLUMNS,
    EVAL_SUMMARY_KEYS,
)
from rlpipe.lm.sampler import Generation
from rlpipe.tasks import MathTask
from rlpipe.tasks.base import Example
from rlpipe.trainer import evaluate
from rlpipe.trainer.evaluate import EvalRequest, category_of, score_examples

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROBLEMS = [("What is $1+2$?", "3"), ("Compute $2\\cdot 5$.", "10"), ("What is $7-4$?", "3"),
            ("Simplify $\\frac{2}{4}$.", "\\frac{1}{2}"), ("What is $3^2$?", "9"), ("What is $12/4$?", "3"),
            ("What is $6+7$?", "13"), ("What is $100-1$?", "99"), ("What is $2^5$?", "32"),
            ("What is $8\\cdot 8$?", "64")]
N_EVAL, MAX_TOKENS = 8, 12


def _write_math_dataset(d):
    d.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", PROBLEMS[:6]), ("validation", PROBLEMS)):
        with open(d / f"{split}.jsonl", "w") as f:
            for problem, answer in rows:
                f.write(json.dumps({"problem": problem, "answer": answer,
                                    "solution": f"Work. The answer is $\\boxed{{{answer}}}$."}) + "\n")
    return d


@pytest.fixture(scope="module")
def setup(tmp_path_factory, make_base, write_config):
    """(config path, checkpoint, dataset dir, tmp dir)."""
    tmp = tmp_path_factory.mktemp("eval")
    ckpt, _ = make_base(tmp, pretrain_steps=0, context_length=512)
    dataset = _write_math_dataset(tmp / "math")
    cfg = write_config(tmp / "config.yaml", train={"task": "math"},
                       math={"eval_size": N_EVAL, "eval_max_tokens": MAX_TOKENS})
    return cfg, ckpt, dataset, tmp


def _run(cfg, ckpt, dataset, out, *extra):
    return evaluate.main(["--config", str(cfg), "--checkpoint", str(ckpt), "--dataset", str(dataset),
                          "--out", str(out), "--threads", "1", "--device", "cpu", *extra])


def _read(out):
    return pd.read_parquet(out / EVAL_FILES["examples"]), json.loads((out / EVAL_FILES["summary"]).read_text())


@pytest.fixture(scope="module")
def ckpt_eval(setup):
    cfg, ckpt, dataset, tmp = setup
    assert _run(cfg, ckpt, dataset, tmp / "out_ckpt", "--seed", "7") == 0
    return _read(tmp / "out_ckpt")


def test_eval_on_a_checkpoint_writes_the_contract(ckpt_eval):
    frame, summary = ckpt_eval
    assert tuple(frame.columns) == EVAL_COLUMNS
    assert all(str(frame[c].dtype) == "int64" for c in EVAL_INT_COLUMNS)
    assert all(str(frame[c].dtype) == "float64" for c in EVAL_FLOAT_COLUMNS)
    assert tuple(summary) == EVAL_SUMMARY_KEYS
    assert summary["n"] == len(frame) == N_EVAL  # math.eval_size
    assert list(frame["index"]) == list(range(N_EVAL))
    assert list(frame["ground_truth"]) == [a for _, a in PROBLEMS[:N_EVAL]]
    assert set(summary["categories"]) == set(EVAL_CATEGORIES)
    assert sum(summary["categories"].values()) == summary["n"]
    assert summary["categories"] == {c: int((frame["category"] == c).sum()) for c in EVAL_CATEGORIES}
    assert summary["accuracy"] == pytest.approx(frame["answer_reward"].mean())
    assert summary["format_rate"] == pytest.approx(frame["format_reward"].mean())
    assert list(frame["category"]) == [category_of(f, a) for f, a in zip(frame["format_reward"],
                                                                         frame["answer_reward"], strict=True)]
    assert (summary["max_tokens"], summary["seed"], summary["prompt"]) == (MAX_TOKENS, 7, "r1_zero")
    assert 0 < summary["tokens_generated"] <= N_EVAL * MAX_TOKENS
    assert set(frame["finish_reason"]) <= {"eos", "stop", "length"}
    assert frame["prompt"].str.contains("Assistant: <think>").all()


def test_eval_on_the_hf_export_matches_the_checkpoint(setup, ckpt_eval):
    """The export holds the same weights (logits agree to ~1e-5) and the sampler seeds each row from
    (seed, prompt tokens), so the same seed draws the same uniforms on both backends and the same
    tokens come out unless a draw lands within float rounding of a CDF step (test_hf_export checks
    the same on its own model). So the responses, not only the category counts, must match."""
    from rlpipe.lm.hf_export import export_hf

    cfg, ckpt, dataset, tmp = setup
    hf_dir = export_hf(ckpt, tmp / "hf")
    assert _run(cfg, hf_dir, dataset, tmp / "out_hf", "--seed", "7") == 0
    frame, summary = _read(tmp / "out_hf")
    ref_frame, ref_summary = ckpt_eval
    assert summary["categories"] == ref_summary["categories"]
    assert list(frame["response"]) == list(ref_frame["response"])
    assert any(frame["response"].str.len() > 0)
    # and the seed matters: another seed gives other responses from the same export
    assert _run(cfg, hf_dir, dataset, tmp / "out_hf2", "--seed", "8", "--n", "3") == 0
    other, _ = _read(tmp / "out_hf2")
    assert list(other["response"]) != list(ref_frame["response"][:3])


def test_categories_of_hand_made_responses(setup):
    _, _, dataset, _ = setup
    task = MathTask(dataset)
    cases = [  # (response, ground truth, expected category)
        ("2 plus 1 </think> <answer>3</answer>", "3", "format1_answer1"),
        ("</think> <answer>\\frac{2}{4}</answer>", "\\frac{1}{2}", "format1_answer1"),
        ("so </think> <answer>4</answer>", "3", "format1_answer0"),
        ("the answer is 3", "3", "format0_answer0"),
        ("<answer>3</answer>", "3", "format0_answer0"),  # no </think>: r1_zero's format is not met
        ("</think> <answer>3", "3", "format0_answer0"),  # unclosed answer tag
    ]
    examples = [Example(prompt=f"p{i}", ground_truth=gt) for i, (_, gt, _) in enumerate(cases)]
    frame, failures = score_examples(task, examples, [r for r, _, _ in cases], ["stop"] * len(cases))
    assert failures == 0
    assert list(frame["category"]) == [c for _, _, c in cases]
    assert list(frame["reward"]) == list(frame["answer_reward"])
    assert category_of(0.0, 1.0) == "format0_answer1"
    assert {category_of(f, a) for f in (0.0, 1.0) for a in (0.0, 1.0)} == set(EVAL_CATEGORIES)


def test_a_failing_grader_scores_zero_and_is_counted(setup):
    _, _, dataset, _ = setup

    class Broken(MathTask):
        def reward(self, response, ground_truth):
            if response == "boom":
                raise RuntimeError("grader bug")
            return super().reward(response, ground_truth)

    examples = [Example("p", "3"), Example("q", "3")]
    frame, failures = score_examples(Broken(dataset), examples, ["boom", "</think> <answer>3</answer>"],
                                     ["stop", "stop"])
    assert failures == 1
    assert list(frame["category"]) == ["format0_answer0", "format1_answer1"]


def test_counts_end_to_end_with_a_stub_sampler(setup, monkeypatch):
    """The sampler replaced by canned responses (in chunks of 3), the rest real: the summary counts
    each category, accuracy is the mean answer reward, rows keep the dataset order."""
    cfg, ckpt, dataset, tmp = setup
    canned = iter(["a </think> <answer>3</answer>", "</think> <answer>11</answer>", "no tags",
                   "</think> <answer>\\frac{1}{2}</answer>", "</think> <answer>9</answer>", "</think> <answer>3"])
    calls = []

    def stub(model, tokenizer, prompts, params, device=None, decode="auto"):
        calls.append(len(prompts))
        texts = [next(canned) for _ in prompts]
        return Generation([[1]] * len(prompts), [[1, 2]] * len(prompts), texts, [], ["stop"] * len(prompts), params)

    monkeypatch.setattr(evaluate, "generate", stub)
    out = tmp / "out_stub"
    s = evaluate.evaluate(load_config(cfg), EvalRequest(ckpt, dataset, n=6, threads=1, device="cpu", chunk=3), out)
    frame, summary = _read(out)
    assert calls == [3, 3]
    assert summary == json.loads(json.dumps(s))
    assert summary["categories"] == {"format1_answer1": 3, "format1_answer0": 1, "format0_answer0": 2,
                                     "format0_answer1": 0}
    assert summary["accuracy"] == pytest.approx(0.5) and summary["format_rate"] == pytest.approx(4 / 6)
    assert summary["tokens_generated"] == 12
    assert list(frame["category"]) == ["format1_answer1", "format1_answer0", "format0_answer0",
                                       "format1_answer1", "format1_answer1", "format0_answer0"]


def _bad_inputs(tmp, ckpt, dataset):
    """name -> (checkpoint, dataset, extra args, text the error must contain)."""
    no_val = _write_math_dataset(tmp / "no_val")
    (no_val / "validation.jsonl").unlink()
    broken = _write_math_dataset(tmp / "broken")
    with open(broken / "validation.jsonl", "a") as f:
        f.write("{not json\n")
    garbage = tmp / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    return {
        "missing dataset": (ckpt, tmp / "nowhere", [], str(tmp / "nowhere")),
        "no validation file": (ckpt, no_val, [], str(no_val)),
        "malformed line": (ckpt, broken, [], f"{broken / 'validation.jsonl'}:11"),
        "missing checkpoint": (tmp / "missing.pt", dataset, [], str(tmp / "missing.pt")),
        "unloadable checkpoint": (garbage, dataset, [], str(garbage)),
        "prompt + max tokens too long": (ckpt, dataset, ["--max-tokens", "400"], "context length 512"),
    }


@pytest.mark.parametrize("case", ["missing dataset", "no validation file", "malformed line", "missing checkpoint",
                                  "unloadable checkpoint", "prompt + max tokens too long"])
def test_bad_inputs_error_naming_them_before_generation(setup, monkeypatch, capsys, case):
    cfg, ckpt, dataset, tmp = setup
    bad_ckpt, bad_dataset, extra, expected = _bad_inputs(tmp / case.replace(" ", "_"), ckpt, dataset)[case]

    def no_generation(*args, **kwargs):
        raise AssertionError("generate() called despite a bad input")

    monkeypatch.setattr(evaluate, "generate", no_generation)
    out = tmp / f"out_{case.replace(' ', '_')}"
    with pytest.raises(SystemExit) as exc:
        _run(cfg, bad_ckpt, bad_dataset, out, *extra)
    assert exc.value.code == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()
