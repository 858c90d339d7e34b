"""The embedded arithmetic task (rlpipe.tasks.math.arithmetic): exact answers, split hygiene, the
r1_zero form of its worked solutions, the files it writes and its config checks."""

from __future__ import annotations

import random
import re

import pytest

from rlpipe.config import ArithmeticConfig, ConfigError, parse_config
from rlpipe.io import read_jsonl
from rlpipe.lm.documents import read_documents
from rlpipe.tasks.math.arithmetic import (
    Problem,
    build_math_data,
    chain_results,
    corpus_document,
    draw_problem,
    draw_slips,
    main,
    unique_problems,
    worked_response,
)
from rlpipe.tasks.math.data import load_math_jsonl
from rlpipe.tasks.math.prompt import format_math_prompt
from rlpipe.tasks.math.reward import r1_zero_reward_fn

SMALL = dict(num_train=300, num_val=100, corpus_documents=600, seed=3)
RIGHT = {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}
WRONG = {"reward": 0.0, "format_reward": 1.0, "answer_reward": 0.0}
PROBLEM = re.compile(r"User: (Compute [^\n]*)\n")


def python_value(problem: str) -> int:
    """The problem's value by Python's own left-to-right evaluation of ``Compute <expr>.``"""
    expr = problem.removeprefix("Compute ").removesuffix(".")
    assert re.fullmatch(r"\d+( [+-] \d+)*", expr), problem
    return eval(expr)  # digits, spaces, + and - only (checked above)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("arith")
    cfg = ArithmeticConfig(**SMALL)
    stats = build_math_data(cfg, out)
    return cfg, out, stats


def test_problems_are_deterministic_for_a_seed_and_differ_across_seeds():
    cfg = ArithmeticConfig(**SMALL)
    a = unique_problems(cfg, 50, "val", set())
    assert a == unique_problems(cfg, 50, "val", set())
    assert a != unique_problems(ArithmeticConfig(**{**SMALL, "seed": 4}), 50, "val", set())


def test_answers_are_exact_and_in_range():
    cfg = ArithmeticConfig(min_ops=1, max_ops=4, max_operand=30, max_value=70)
    rng = random.Random(0)
    for _ in range(500):
        p = draw_problem(cfg, rng)
        assert 1 <= len(p.ops) <= 4 and 1 <= p.first <= 30
        assert p.answer == python_value(p.text)
        value = p.first
        for op, b in p.ops:  # every intermediate result stays in 0..max_value
            assert 1 <= b <= 30
            value = value + b if op == "+" else value - b
            assert 0 <= value <= 70


def test_worked_solution_scores_one_and_a_wrong_answer_scores_zero(data):
    _, out, _ = data
    for split in ("train.jsonl", "val.jsonl"):
        records = read_jsonl(out / split)
        assert all(r["answer"] == str(python_value(r["problem"])) for r in records)
        for rec in records[:40]:  # math-verify grading costs ~4 ms a call: a sample keeps this fast
            p = _parse(rec["problem"])
            response = worked_response(p)
            assert response.startswith(" ") and response.endswith(" </answer>")
            assert r1_zero_reward_fn(response, rec["answer"]) == RIGHT, response
            wrong = response.replace(f"<answer> {rec['answer']} </answer>", f"<answer> {p.answer + 1} </answer>")
            assert r1_zero_reward_fn(wrong, rec["answer"]) == WRONG, wrong
            assert f"\\boxed{{{rec['answer']}}}" in rec["solution"]


def test_prompt_plus_solution_is_the_corpus_document_form():
    p = Problem(7, (("+", 12), ("-", 5)))
    assert worked_response(p) == " 7 + 12 = 19. 19 - 5 = 14. </think> <answer> 14 </answer>"
    doc = corpus_document(p, (False, False))
    assert doc == format_math_prompt("r1_zero", "Compute 7 + 12 - 5.") + worked_response(p)
    assert corpus_document(p, (False, False), drill=True) == doc[doc.index("User: "):]
    # a slip miscopies an operator; the step is computed right and carried on, the answer is wrong
    slipped = worked_response(p, (False, True))
    assert slipped == " 7 + 12 = 19. 19 + 5 = 24. </think> <answer> 24 </answer>"
    assert r1_zero_reward_fn(slipped, "14") == WRONG


def test_slips_keep_every_step_true_and_in_range_at_the_configured_rate():
    cfg = ArithmeticConfig(slip_rate=0.3, max_ops=1, min_ops=1, max_operand=10, max_value=40)
    rng = random.Random(1)
    flips = []
    for _ in range(4000):
        p = draw_problem(cfg, rng)
        slips = draw_slips(cfg, p, rng)
        for a, op, b, r in chain_results(p, slips):
            assert (a + b if op == "+" else a - b) == r and 0 <= r <= cfg.max_value
        flips.append(slips[0])
    # one op: a flip is impossible only where "+" would go below 0 (a < b: ~45% of the "+" steps)
    assert 0.2 < sum(flips) / len(flips) < 0.3
    no_slips = ArithmeticConfig(slip_rate=0.0)
    assert not any(any(draw_slips(no_slips, draw_problem(no_slips, rng), rng)) for _ in range(200))


def test_splits_are_disjoint_and_val_is_absent_from_the_corpus(data):
    cfg, out, stats = data
    train = [r["problem"] for r in read_jsonl(out / "train.jsonl")]
    val = [r["problem"] for r in read_jsonl(out / "val.jsonl")]
    assert (len(train), len(val)) == (len(set(train)), len(set(val))) == (cfg.num_train, cfg.num_val)
    assert not set(train) & set(val)
    docs = list(read_documents(out / "corpus.txt"))
    assert len(docs) == stats.documents == cfg.corpus_documents
    corpus_problems = {PROBLEM.search(d).group(1) for d in docs}
    assert not corpus_problems & set(val)
    full = [d for d in docs if d.startswith("A conversation")]
    assert 0 < len(full) < len(docs)  # drills and full r1_zero documents both occur
    assert all(d.endswith("</answer>") and d.split("<think>")[-1].count("</answer>") == 1 for d in docs)


def test_files_load_as_math_data(data):
    _, out, _ = data
    train, val = load_math_jsonl(out / "train.jsonl"), load_math_jsonl(out / "val.jsonl")
    assert len(train) == SMALL["num_train"] and len(val) == SMALL["num_val"]
    assert val[0].prompt.endswith("Assistant: <think>") and val[0].ground_truth.isdigit()


def test_cli_writes_the_files(tmp_path, capsys):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text("math:\n  arithmetic: {num_train: 20, num_val: 10, corpus_documents: 30}\n")
    assert main(["--config", str(cfg_path), "--out", str(tmp_path / "d")]) == 0
    assert {p.name for p in (tmp_path / "d").iterdir()} == {"train.jsonl", "val.jsonl", "corpus.txt"}
    assert "20 train and 10 val problems" in capsys.readouterr().out


def test_a_too_small_problem_space_fails_clearly():
    cfg = ArithmeticConfig(min_ops=1, max_ops=1, max_operand=2, max_value=4, num_val=50)
    with pytest.raises(ValueError, match="distinct val problems"):
        unique_problems(cfg, cfg.num_val, "val", set())


@pytest.mark.parametrize(("override", "key"), [
    ({"num_train": 0}, "math.arithmetic.num_train"),
    ({"max_operand": 1}, "math.arithmetic.max_operand"),
    ({"slip_rate": 1.0}, "math.arithmetic.slip_rate"),
    ({"drill_fraction": -0.1}, "math.arithmetic.drill_fraction"),
    ({"min_ops": 3, "max_ops": 2}, "math.arithmetic.min_ops"),
    ({"max_operand": 50, "max_value": 40}, "math.arithmetic.max_operand"),
    ({"seed": -1}, "math.arithmetic.seed"),
])
def test_bad_config_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        ArithmeticConfig(**override)
    with pytest.raises(ConfigError, match=re.escape(key)):
        parse_config({"math": {"arithmetic": override}})


def _parse(text: str) -> Problem:
    tokens = text.removeprefix("Compute ").removesuffix(".").split()
    ops = tuple((tokens[i], int(tokens[i + 1])) for i in range(1, len(tokens), 2))
    return Problem(int(tokens[0]), ops)
