"""gpu-check's ``seed_step`` part on CPU at its tiny shape (the code path the GPU runs at the seed's):
the drawn lengths' arithmetic, seed 001's settings read from ``config/math.yaml``, the FLOP count of
variable-length generation, and one run end to end: rows stop at their drawn caps, every phase is
timed, the learner's new weights reach the generator, the evaluation's projection is its two
chunks' arithmetic, the goals are null off the seed's GPU, and ``rlpipe gpu-report`` renders it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlpipe.bench import gpu_report, seed_shape, seed_step
from rlpipe.bench.flops import decode_flops, forward_flops
from rlpipe.bench.qwen_step import qwen_config

ROOT = Path(__file__).resolve().parents[1]
MATH_YAML = ROOT / "config" / "math.yaml"


def test_the_erlang2_quantile_inverts_its_cdf():
    for p in (0.01, 0.5, 0.9, 0.998):
        x = seed_shape.erlang2_quantile(p, 1.0)
        assert 1 - math.exp(-x) * (1 + x) == pytest.approx(p, abs=1e-12)
    assert seed_shape.erlang2_quantile(0.5, 200.0) == pytest.approx(200 * 1.678347, rel=1e-5)  # the median
    with pytest.raises(ValueError, match="p must lie in"):
        seed_shape.erlang2_quantile(1.0, 1.0)


def test_the_drawn_lengths_have_the_seed_s_mean_and_tail():
    lengths = seed_shape.clipped_lengths(256, 400, 16, 1024, seed=12)
    assert abs(sum(lengths) / 256 - 400) <= 0.5
    assert min(lengths) >= 16 and max(lengths) == 1024
    assert 4 <= lengths.count(1024) <= 16  # the longest few percent reach the cap
    assert lengths == seed_shape.clipped_lengths(256, 400, 16, 1024, seed=12)  # fixed seed, same rows
    assert sorted(lengths) == sorted(seed_shape.clipped_lengths(256, 400, 16, 1024, seed=13))  # only the order
    assert lengths != sorted(lengths)
    with pytest.raises(ValueError, match="lo < mean < hi"):
        seed_shape.clipped_lengths(8, 2000, 16, 1024)


def test_prompts_are_r1_zero_long():
    template = seed_shape.r1_zero_template_tokens()
    assert 80 <= template <= 130  # the template's ~430 characters at 4 per token
    lens = seed_shape.prompt_lengths(32, seed=13)
    assert all(template + 8 <= n <= template + 400 for n in lens)
    assert abs(sum(lens) / 32 - template - seed_shape.QUESTION_MEAN_TOKENS) <= 0.5
    ids = seed_shape.random_prompts(lens[:3], 100, seed=1)
    assert [len(x) for x in ids] == lens[:3] and all(0 < t < 100 for x in ids for t in x)


def test_seed_001_settings_come_from_math_yaml():
    cfg, size = seed_step.seed_settings(MATH_YAML, "cpu", "static")
    assert (cfg.rollout_batch_size, cfg.group_size, cfg.sampling_max_tokens) == (256, 8, 1024)
    assert cfg.derived().micro_train_batch_size == 2 and cfg.derived().n_prompts_per_rollout_batch == 32
    assert cfg.recompute_old_log_probs and cfg.decode == "static" and cfg.dtype == "bfloat16"
    assert size == {"eval_size": 5000, "eval_max_tokens": 1024}
    tiny, _ = seed_step.seed_settings(MATH_YAML, "cpu", "static", rollouts=16, max_tokens=16)
    assert tiny.derived().micro_train_batch_size == 2 and tiny.gradient_accumulation_steps == 8
    with pytest.raises(ValueError, match="no math.train section"):
        seed_step.seed_settings(ROOT / "config" / "gpu.yaml", "cpu", "static")


def test_generation_flops_count_each_prompt_s_prefill_once():
    cfg = qwen_config(**seed_step.SCALES["tiny"].model)
    assert seed_step.decode_work(cfg, [7], 1, [5]) == pytest.approx(decode_flops(cfg, 7, 5, 1))
    grouped = seed_step.decode_work(cfg, [7, 3], 4, [5] * 4 + [2] * 4)
    alone = decode_flops(cfg, 7, 5, 4) + decode_flops(cfg, 3, 2, 4)
    assert grouped == pytest.approx(alone - 3 * forward_flops(cfg, [7]) - 3 * forward_flops(cfg, [3]))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One ``measure`` at the tiny shape (the part's whole path), and the JSON it wrote."""
    d = tmp_path_factory.mktemp("seed_step")
    result = seed_step.measure(torch.device("cpu"), d / "seed_step.json", "tiny", decode="static",
                               math_yaml=MATH_YAML, work_dir=d / "work")
    return result, json.loads((d / "seed_step.json").read_text()), d


def test_a_tiny_run_measures_every_phase_and_stops_rows_at_their_caps(tiny_run):
    result, written, d = tiny_run
    assert written == json.loads(json.dumps(result)) and result["status"] == "done"
    assert result["settings"]["decode"] == result["settings"]["decode_resolved"] == "static"
    assert not list((d / "work").iterdir())  # the random-weight policy directory is removed
    scale = seed_step.SCALES["tiny"]
    caps = seed_shape.clipped_lengths(16, scale.mean_tokens, scale.min_tokens, 16, seed_step.LENGTH_SEED)
    for key, expected in (("warmup", [min(c, scale.warmup_tokens) for c in caps]), ("steps_at_mean", caps),
                          ("steps_at_max", [16] * 16)):
        (rec,) = result[key]
        assert set(rec["phases_s"]) == {"generate", "score", "old_logprobs", "update", "hand_off", "other"}
        assert all(v > 0 for v in rec["phases_s"].values()), rec["phases_s"]
        assert rec["step_s"] == pytest.approx(sum(rec["phases_s"].values()), abs=1e-3)
        assert rec["rows"] == 16 and rec["prompts"] == 2 and rec["generated_tokens"] <= sum(expected)
        assert rec["response_max"] <= max(expected)
        assert rec["finish_reasons"].get("length", 0) >= 12  # random weights reach their caps (EOS ~1/1024)
        assert all(0 < f < 1 for f in rec["fraction_of_device_peak"].values())
        assert math.isfinite(rec["loss_policy"])
    assert result["steps_at_max"][0]["generated_tokens"] >= 12 * 16
    e = result["engine_vs_hf"]
    # the ratio of the unrounded times, rounded to 2 decimals; the times are stored to 4 (a 1e-2 s time
    # has up to 0.5% error, so the ratio of the stored ones may differ by 1% plus the ratio's own rounding)
    ratio = e["hf_generate_s"] / e["engine_s"]
    assert e["engine_over_hf_generate"] > 0
    assert e["engine_over_hf_generate"] == pytest.approx(ratio, rel=0.02, abs=0.005), (e, ratio)
    v = result["eval"]
    assert (v["prompts"], v["chunk"], v["chunks"]) == (10, 4, 3)
    assert v["projected_s"] == pytest.approx(v["measured_chunk_s"][0] + 2 * v["measured_chunk_s"][1], abs=0.06)
    assert {g["met"] for g in result["goals"].values()} == {None}  # the goals are the seed's, on a GPU
    assert result["goals"]["step_s_at_mean"]["value"] == result["steps_at_mean"][0]["step_s"]


def test_the_learner_s_weights_reach_the_generator_after_a_step(tmp_path):
    cfg, _ = seed_step.seed_settings(MATH_YAML, "cpu", "static", rollouts=16, max_tokens=8, threads=1)
    gen, learner = seed_step.build(cfg, qwen_config(**seed_step.SCALES["tiny"].model), torch.device("cpu"), tmp_path)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    prompts = seed_shape.random_prompts([5, 7], 1024, seed=0)
    rec = seed_step.grpo_step(gen, learner, prompts, [3] * 16, step=1)
    after = learner.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after)  # the update moved the weights
    assert all(torch.equal(v, after[k].to(v.dtype)) for k, v in gen.model.state_dict().items())
    assert gen.version == learner.version == 1 and rec["hand_off_bytes"] > 0
    assert rec["generated_tokens"] <= 48 and rec["finish_reasons"].get("length", 0) >= 12


def test_gpu_report_renders_the_seed_step(tiny_run):
    result = tiny_run[0]
    text = gpu_report.render_result({"gpu": {"name": "G"}, "date": "2026-12-01", "parts": {
        "seed_step": {"status": "ok", "seconds": 30.0, "result": result}}})
    m = result["steps_at_mean"][0]
    assert "**Seed-scale GRPO steps, Qwen2.5-Math-1.5B shape (random weights)**" in text
    assert "- tiny shape on cpu: 16 rollouts in groups of 8, up to 16 response tokens" in text
    assert f"responses of drawn lengths (mean 6): **{gpu_report._num(m['step_s'])} s/step**" in text
    assert "- every response 16 tokens: **" in text
    assert f"{gpu_report._num(result['engine_vs_hf']['engine_over_hf_generate'])}x" in text
    assert f"zero-shot evaluation, 10 prompts x up to 16 tokens: {gpu_report._num(result['eval']['projected_s'])} s" \
        in text
    assert "- goal, s/step at the drawn lengths (mean 400) <= 12: " in text and "**not applicable here**" in text
    cut = {k: v for k, v in result.items() if k not in ("engine_vs_hf", "eval", "steps_at_max")}
    partial = gpu_report._seed_lines({**cut, "status": "engine_vs_hf"})
    assert "the part stopped at: engine_vs_hf" in partial[0] and len(partial) == 2 + len(result["goals"])
