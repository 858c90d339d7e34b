"""``rlpipe bench trl``: rlpipe's colocated GRPO side by side with TRL's GRPOTrainer.

- the skip path: with ``trl`` not importable (``sys.modules["trl"] = None``) the command writes
  ``{"skipped": true, "reason": ...}`` and trains nothing;
- bad inputs fail before any work with a usage error naming the file (or key);
- the settings mapping: one ``BenchSettings`` gives both the ``GRPOConfig`` kwargs and the
  ``rlpipe train`` overrides, and they agree on G, batch, steps, learning rate, max tokens,
  temperature, ...; the overrides validate as a train section;
- TRL gets rlpipe's prompt order; the reward wrapper scores and counts tokens;
- end to end (slow, needs trl): 2 steps of a micro model on both sides.
"""

from __future__ import annotations

import json
import sys

import pytest

from rlpipe import contract
from rlpipe.bench import trl as bench
from rlpipe.bench import trl_settings, trl_sides
from rlpipe.config import TrainConfig, apply_overrides, from_dict, to_dict


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, make_base, make_dataset):
    """(checkpoint, dataset dir) of a micro model (barely trained: only the files matter here)."""
    d = tmp_path_factory.mktemp("bench_trl")
    ckpt, _ = make_base(d, pretrain_steps=1)
    return str(ckpt), str(make_dataset(d / "data"))


def _fail(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


# --------------------------------------------------------------------------- skip path


def test_skip_when_trl_is_missing_writes_the_reason_and_trains_nothing(inputs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` now raises ImportError
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("trained although trl is missing"))
    assert trl_settings.import_trl() is None
    out = tmp_path / "trl.json"
    assert bench.main(["--checkpoint", inputs[0], "--dataset", inputs[1], "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result.pop("provenance")) == set(contract.PROVENANCE_KEYS)  # every bench JSON says what it ran on
    assert result == {"bench": "trl", "skipped": True, "reason": "trl is not installed: pip install -e '.[bench]'",
                      "device": "cpu", "fraction_of_shape_peak": None, "fraction_of_device_peak": None,
                      "peak_note": "skipped: nothing was measured"}  # both fractions, even when nothing ran


def test_import_trl_returns_the_module_when_it_imports(monkeypatch):
    fake = type(sys)("trl")
    monkeypatch.setitem(sys.modules, "trl", fake)
    assert trl_settings.import_trl() is fake


def test_the_cli_knows_the_bench():
    from rlpipe.cli import BENCHES

    assert BENCHES["trl"] == "rlpipe.bench.trl"


# --------------------------------------------------------------------------- input validation


def test_missing_checkpoint_is_named(inputs, tmp_path, capsys):
    missing = tmp_path / "nope.pt"
    err = _fail(["--checkpoint", str(missing), "--dataset", inputs[1]], capsys)
    assert str(missing) in err and "--checkpoint" in err


def test_damaged_checkpoint_is_named(inputs, tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    err = _fail(["--checkpoint", str(bad), "--dataset", inputs[1]], capsys)
    assert str(bad) in err and "--checkpoint" in err


def test_missing_dataset_split_is_named(inputs, tmp_path, capsys):
    d = tmp_path / "data"
    d.mkdir()
    (d / "train.jsonl").write_text(json.dumps({"prompt": "Write about: cat\n", "keywords": ["cat"]}) + "\n")
    err = _fail(["--checkpoint", inputs[0], "--dataset", str(d)], capsys)
    assert str(d / "val.jsonl") in err and "--dataset" in err


def test_bad_dataset_line_is_named_with_its_line(inputs, tmp_path, capsys):
    d = tmp_path / "data"
    d.mkdir()
    good = json.dumps({"prompt": "Write about: cat\n", "keywords": ["cat"]})
    (d / "train.jsonl").write_text(good + "\n" + json.dumps({"prompt": "x", "keywords": []}) + "\n")
    (d / "val.jsonl").write_text(good + "\n")
    err = _fail(["--checkpoint", inputs[0], "--dataset", str(d)], capsys)
    assert f"{d / 'train.jsonl'}:2" in err


def test_bad_config_key_is_named(inputs, tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("train:\n  lerning_rate: 0.1\n")
    err = _fail(["--checkpoint", inputs[0], "--dataset", inputs[1], "--config", str(cfg)], capsys)
    assert str(cfg) in err and "train.lerning_rate" in err


@pytest.mark.parametrize("flag", ["--steps", "--prompts-per-step", "--threads", "--val-size"])
def test_non_positive_sizes_are_refused(inputs, flag, capsys):
    err = _fail(["--checkpoint", inputs[0], "--dataset", inputs[1], flag, "0"], capsys)
    assert flag.lstrip("-").replace("-", "_") in err


def test_group_size_one_is_refused_because_trl_needs_two(inputs, tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("train:\n  group_size: 1\n  rollout_batch_size: 8\n  train_batch_size: 8\n")
    err = _fail(["--checkpoint", inputs[0], "--dataset", inputs[1], "--config", str(cfg)], capsys)
    assert "group_size" in err


# --------------------------------------------------------------------------- settings mapping


def _settings() -> trl_settings.BenchSettings:
    """Non-default values everywhere, so a mapping that ignores the config shows."""
    train = TrainConfig(group_size=3, rollout_batch_size=9, train_batch_size=9, sampling_max_tokens=17,
                        sampling_temperature=0.7, sampling_top_p=0.9, learning_rate=3e-4, betas=[0.8, 0.9],
                        weight_decay=0.01, max_grad_norm=0.5, cliprange=0.3, seed=5, val_size=7, val_seed=11)
    return trl_settings.settings_from_config(train, steps=5, prompts_per_step=6, threads=1)


def test_settings_come_from_the_train_section():
    s = _settings()
    assert (s.group_size, s.max_new_tokens, s.temperature, s.top_p) == (3, 17, 0.7, 0.9)
    assert (s.learning_rate, s.betas, s.weight_decay, s.cliprange) == (3e-4, (0.8, 0.9), 0.01, 0.3)
    assert (s.steps, s.prompts_per_step, s.samples_per_step, s.threads, s.seed) == (5, 6, 18, 1, 5)


def test_grpo_config_and_rlpipe_overrides_agree():
    s = _settings()
    kw, ov = trl_settings.grpo_config_kwargs(s, "/tmp/x"), trl_settings.rlpipe_train_overrides(s)
    assert kw["num_generations"] == ov["group_size"] == 3
    assert kw["per_device_train_batch_size"] == ov["rollout_batch_size"] == ov["train_batch_size"] == 18
    assert kw["gradient_accumulation_steps"] == ov["gradient_accumulation_steps"] == 1
    assert kw["num_iterations"] == ov["epochs_per_rollout_batch"] == 1
    assert kw["max_steps"] == ov["n_grpo_steps"] == 5
    assert kw["learning_rate"] == ov["learning_rate"] == 3e-4
    assert kw["max_completion_length"] == ov["sampling_max_tokens"] == 17
    assert kw["temperature"] == ov["sampling_temperature"] == 0.7
    assert kw["top_p"] == ov["sampling_top_p"] == 0.9 and kw["top_k"] == 0
    assert [kw["adam_beta1"], kw["adam_beta2"]] == ov["betas"] == [0.8, 0.9]
    assert kw["weight_decay"] == ov["weight_decay"] == 0.01
    assert kw["max_grad_norm"] == ov["max_grad_norm"] == 0.5
    assert kw["epsilon"] == ov["cliprange"] == 0.3
    assert kw["beta"] == ov["kl_coef"] == 0.0 and ov["kl_monitor"] is False and ov["kl_monitor_every"] == 5
    assert kw["seed"] == ov["seed"] == 5 and ov["threads"] == 1
    assert kw["loss_type"] == "grpo" and ov["length_normalization"] == "masked_mean"
    assert kw["lr_scheduler_type"] == "constant" and kw["shuffle_dataset"] is False
    assert kw["use_cpu"] and not kw["bf16"] and ov["device"] == "cpu" and ov["dtype"] == "float32"
    assert ov["mode"] == "colocated_sync" and ov["val_every"] == ov["checkpoint_every"] == 5


def test_rlpipe_overrides_are_a_valid_train_section():
    s = _settings()
    overrides = trl_settings.rlpipe_train_overrides(s)
    train = from_dict(TrainConfig, apply_overrides(to_dict(TrainConfig()), overrides), "train")
    sizes = train.derived()
    assert sizes.total_optimizer_steps == 5 and sizes.n_prompts_per_rollout_batch == 6


@pytest.mark.filterwarnings("ignore::FutureWarning")  # TRL's own gradient_checkpointing field (transformers 5)
def test_grpo_config_accepts_the_kwargs_and_is_on_policy(tmp_path):
    trl = pytest.importorskip("trl")
    s = _settings()
    cfg = trl.GRPOConfig(**trl_settings.grpo_config_kwargs(s, str(tmp_path)))
    assert cfg.generation_batch_size == s.samples_per_step and cfg.steps_per_generation == 1
    assert cfg.scale_rewards == "group" and cfg.report_to == []
    assert str(cfg.lr_scheduler_type.value) == "constant" and str(cfg.eval_strategy.value) == "no"
    assert not cfg.gradient_checkpointing and not cfg.bf16 and cfg.use_cpu


# --------------------------------------------------------------------------- prompts and reward


def test_trl_gets_rlpipes_prompt_order(inputs):
    from rlpipe.tasks.keyword.task import KeywordInclusionTask

    s = trl_settings.BenchSettings(steps=3, prompts_per_step=4, seed=2)
    rows = trl_settings.prompt_sequence(inputs[1], s)
    task = KeywordInclusionTask(inputs[1])
    expected = [e.prompt for b in range(3) for e in task.prompts_for_batch(b, 4, 2)]
    assert [r["prompt"] for r in rows] == expected and len(rows) == 12
    assert all(isinstance(r["keywords"], list) and r["keywords"] for r in rows)


def test_reward_wrapper_scores_keywords_and_counts_tokens():
    r = trl_sides.KeywordReward()
    out = r(prompts=["p", "p"], completions=["The Cats sat.", "a dog"], completion_ids=[[1, 2, 3], [4]],
            keywords=[["cat"], ["cat"]], trainer_state=None)
    assert out == [1.0, 0.0] and r.tokens == 4 and r.rewards == [1.0, 0.0]
    assert r.__name__ == "keyword_inclusion"


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
@pytest.mark.ray
def test_end_to_end_two_steps(tmp_path, make_base, make_dataset):
    pytest.importorskip("trl")
    ckpt, _ = make_base(tmp_path, pretrain_steps=100)
    data = make_dataset(tmp_path / "data")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("train:\n  group_size: 2\n  rollout_batch_size: 4\n  train_batch_size: 4\n"
                   "  sampling_max_tokens: 8\n  val_size: 3\n  learning_rate: 0.01\n  ray_timeout_s: 300\n")
    out = tmp_path / "trl.json"
    argv = ["--checkpoint", str(ckpt), "--dataset", str(data), "--config", str(cfg), "--steps", "2",
            "--prompts-per-step", "2", "--threads", "1", "--pairs", "2", "--work-dir", str(tmp_path / "work"),
            "--out", str(out)]
    assert bench.main(argv) == 0
    res = json.loads(out.read_text())
    assert res["skipped"] is False and res["settings"]["group_size"] == 2
    for side in ("rlpipe", "trl"):
        r = res[side]
        assert r["samples"] == 2 * 2 * 2 and 0 < r["tokens"] <= r["samples"] * 8
        assert r["samples_per_s"] > 0 and r["step_samples_per_s_median"] > 0
        assert 0 <= r["val_reward_initial"] <= 1 and 0 <= r["val_reward_final"] <= 1
    assert res["rlpipe"]["base"] == "checkpoint"  # --rlpipe-model native, the default
    assert set(res["ratios_rlpipe_over_trl"]) >= {"samples_per_s", "tokens_per_s", "step_samples_per_s_median"}
    assert res["versions"]["trl"] and res["notes"]
    q = res["ratios_rlpipe_over_trl"]
    assert q["pairs"] == len(res["pairs"]) == 2
    for k in ("samples_per_s", "step_samples_per_s_median"):
        lo, hi = q[f"{k}_spread"]
        assert lo <= q[k] <= hi and [p["ratios"][k] for p in res["pairs"]] != []
    assert {"generate", "score", "logprobs", "update", "weight_sync", "other", "step"} <= set(
        res["rlpipe"]["phases_s_per_step"])
    trl_phases = res["trl"]["phases_s_per_step"]
    assert trl_phases["generate"] > 0 and trl_phases["score"] > 0 and trl_phases["step"] > trl_phases["generate"]


# --------------------------------------------------------------------------- phase split


def test_rlpipe_phase_split_hand_computed():
    """Two steps of 1.0 s and 3.0 s: the phases are each step's time/<phase> columns (the two log-prob
    passes summed, a missing phase 0), other is the rest of the step; every value is the median."""
    import pandas as pd

    from rlpipe.bench.phase_split import rlpipe_phase_split

    m = pd.DataFrame({"step": [0, 1, 2], "wall_time": [0.0, 1.0, 4.0],
                      "time/generate": [None, 0.4, 1.0], "time/score": [None, 0.1, 0.1],
                      "time/ref_logprobs": [None, 0.1, float("nan")], "time/old_logprobs": [None, 0.0, 0.2],
                      "time/update": [None, 0.2, 1.0], "time/weight_sync": [None, 0.1, 0.1]})
    split = rlpipe_phase_split(m)
    # step 1: 0.4 + 0.1 + 0.1 + 0.2 + 0.1 = 0.9 of 1.0 -> other 0.1; step 2: 2.4 of 3.0 -> other 0.6
    assert split == {"generate": 0.7, "score": 0.1, "logprobs": 0.15, "update": 0.6, "weight_sync": 0.1,
                     "other": 0.35, "step": 2.0}


def test_phase_clock_times_wrapped_calls_per_step():
    import time

    from rlpipe.bench.phase_split import PhaseClock

    clock = PhaseClock()
    gen = clock.wrap(lambda: time.sleep(0.05) or "ids", "generate")
    score = clock.wrap(lambda x: time.sleep(0.02) or [1.0], "score")
    clock.start()
    for _ in range(2):
        assert gen() == "ids" and score(1) == [1.0]
        time.sleep(0.03)
        clock.end_step()
    split = clock.split()
    assert len(clock.steps) == 2
    assert 0.05 <= split["generate"] < 0.09 and 0.02 <= split["score"] < 0.06
    assert split["other"] >= 0.03 and split["step"] == pytest.approx(
        split["generate"] + split["score"] + split["other"], abs=2e-3)


def test_a_side_summary_never_reports_one_pairs_value_as_the_sides():
    """Fields every pair shares stay; a field that differs is a median (numbers) and a per-pair list."""
    from rlpipe.bench.trl import _summary

    def run(sps, tokens, run_dir):
        return {"samples": 8, "tokens": tokens, "run_dir": run_dir, "samples_per_s": sps,
                "step_samples_per_s_median": sps, "tokens_per_s": sps * 2, "wall_s": 8 / sps,
                "phases_s_per_step": {"generate": 1 / sps}, "val_reward_final": sps / 10,
                "load_avg_before": 1.0, "load_avg_after": 2.0}

    s = _summary([run(1.0, 40, "a"), run(4.0, 60, "b"), run(2.0, 50, "c")])
    assert s["samples"] == 8 and s["samples_per_s"] == 2.0 and s["tokens"] == 50
    assert s["tokens_per_pair"] == [40, 60, 50] and s["run_dir_per_pair"] == ["a", "b", "c"]
    assert "run_dir" not in s and s["val_reward_final"] == 0.2 and s["phases_s_per_step"] == {"generate": 0.5}
    assert s["load_avg_before"] == 1.0 and s["load_avg_per_pair"] == [[1.0, 2.0]] * 3


# --------------------------------------------------------------------------- the larger preset


def test_preset_checkpoint_keeps_the_tokenizer_and_vocabulary(inputs, tmp_path):
    from rlpipe.lm.checkpoint import load_checkpoint
    from rlpipe.lm.model import ModelConfig

    base = load_checkpoint(inputs[0])
    path = bench.preset_checkpoint(inputs[0], "assignment", tmp_path / "big.pt")
    big = load_checkpoint(path)
    assert big.tokenizer == base.tokenizer
    assert big.model_config == ModelConfig.from_preset("assignment", vocab_size=base.model_config.vocab_size)
    assert big.model_config.num_parameters() >= 10 * base.model_config.num_parameters()


def test_unknown_preset_is_named(inputs, tmp_path):
    with pytest.raises(trl_settings.BenchInputError, match="--preset: unknown model preset 'huge'"):
        bench.preset_checkpoint(inputs[0], "huge", tmp_path / "x.pt")


# --------------------------------------------------------------------------- one GPU


def test_device_cuda_without_cuda_is_refused_in_one_line(monkeypatch, capsys):
    """Refused before anything is opened or trained (the paths need not even exist)."""
    monkeypatch.setattr(bench, "_cuda_available", lambda: False)
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("ran although CUDA is missing"))
    err = _fail(["--checkpoint", "/no/such.pt", "--dataset", "/no/such", "--device", "cuda"], capsys)
    assert err.count("\n") == 1 and "--device cuda" in err and "CUDA is not available" in err


def test_aot_decode_is_refused_on_cuda(inputs, monkeypatch, capsys):
    monkeypatch.setattr(bench, "_cuda_available", lambda: True)
    err = _fail(["--checkpoint", inputs[0], "--dataset", inputs[1], "--device", "cuda", "--decode", "aot"], capsys)
    assert "--decode aot is CPU only" in err


def test_cuda_settings_put_both_sides_on_the_gpu(tmp_path):
    import dataclasses

    from rlpipe.config import load_config

    s = dataclasses.replace(_settings(), device="cuda")
    s.check()
    kw, ov = trl_settings.grpo_config_kwargs(s, "/tmp/x"), trl_settings.rlpipe_train_overrides(s)
    assert kw["use_cpu"] is False and not kw["bf16"] and ov["device"] == "cuda" and ov["dtype"] == "float32"
    path = tmp_path / "run.yaml"
    trl_sides._write_run_config(None, s, path)
    cfg = load_config(path)  # a cuda run with its one GPU declared is a valid pipeline config
    assert cfg.train.device == "cuda" and cfg.workflow.gpus_per_colocated == 1
    trl_sides._write_run_config(None, _settings(), path)
    assert load_config(path).workflow.gpus_per_colocated == 0
    assert any("one GPU on both sides" in n for n in bench.notes(s, "checkpoint"))
    with pytest.raises(trl_settings.BenchInputError, match="device"):
        dataclasses.replace(s, device="tpu").check()


def test_useful_flops_by_hand():
    """Two samples of one 3-token prompt with 8 response tokens between them (mean 4): each is a
    KV-cache generation (the work of one causal forward over 7 tokens) and a training forward +
    backward over the 7 tokens with the LM head on the 4 response tokens."""
    from rlpipe.bench.flops import forward_flops, train_flops
    from rlpipe.lm.model import ModelConfig

    cfg = ModelConfig(vocab_size=10, context_length=16, num_layers=1, d_model=4, num_heads=2, d_ff=8)
    want = 2 * (forward_flops(cfg, [7]) + train_flops(cfg, [7], head_tokens=4))
    assert bench.useful_flops(cfg, [3], group_size=2, response_tokens=8) == want
    assert bench.useful_flops(cfg, [3, 3], group_size=2, response_tokens=16) == 2 * want
    chip = {"flops_per_s": 1e12}
    assert bench.side_fractions(4e9, 2.0, 1e10, chip) == {"useful_gflops": 2.0, "fraction_of_shape_peak": 0.2,
                                                          "fraction_of_device_peak": 0.002}
