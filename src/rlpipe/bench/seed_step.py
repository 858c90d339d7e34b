"""Seed-scale GRPO steps of a Qwen2.5-Math-1.5B-shaped policy, measured (a part of ``rlpipe
gpu-check``, run in its own process):

    python -m rlpipe.bench.seed_step --out seed_step.json [--device cuda] [--shape seed|tiny]

What runs is the pipeline's own colocated step (``rlpipe.trainer.actors.workers.ColocatedWorker``'s
roles): its ``Generator`` and ``Learner``, built from a local HF directory of the published model's
shape with random weights (``rlpipe.bench.seed_shape``: nothing is downloaded), with seed 001's
settings from ``config/math.yaml``'s ``math.train`` (256 rollouts, group 8, so 32 prompts; up to 1024
response tokens; micro-batches of 2; bf16 compute over fp32 masters; old log-probs recomputed; no
reference model). What one step runs and what it reports: ``grpo_step``; the measurements, in
order: ``measure``.

The JSON is rewritten after each measurement, so a part killed at its time limit keeps what it had.
On CPU (the tests) the same code runs at ``--shape tiny``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
import time
from pathlib import Path

import torch
import yaml

from rlpipe.bench import seed_shape
from rlpipe.bench.flops import (
    PEAK_NOTE,
    device_peak,
    forward_flops,
    fraction,
    gflops,
    matmul_params,
    matmul_peak,
    peak_fields,
    train_flops,
)
from rlpipe.bench.qwen_step import QWEN_MATH_1_5B, hf_generate_s, qwen_config
from rlpipe.config import TrainConfig
from rlpipe.io import write_json
from rlpipe.lm.adapters import resolve
from rlpipe.lm.device import autocast
from rlpipe.lm.sampler import SamplingParams, generate
from rlpipe.rl.records import RolloutBatch, train_batches
from rlpipe.rl.scoring import score_batch
from rlpipe.trainer import evaluate
from rlpipe.trainer.actors.generator import Generator
from rlpipe.trainer.actors.learner import Learner
from rlpipe.trainer.weight_sync import copy_weights


@dataclasses.dataclass(frozen=True)
class Scale:
    """The sizes a run measures at (``SCALES``)."""
    mean_tokens: int  # the drawn lengths' mean
    min_tokens: int  # the drawn lengths' floor
    warmup_tokens: int  # the warm-up step's cap per row
    hf_rows: int  # the engine against HF generate: rows, prompt tokens, new tokens
    hf_prompt: int
    hf_tokens: int
    eval_chunk: int | None  # prompts per eval chunk (None: rlpipe eval's own on the device)
    question_mean: int
    question_range: tuple[int, int]
    model: dict  # Qwen2Config overrides
    train: dict  # TrainConfig overrides
    peak_size: int | None = None  # the device peak's matmul side (None: flops.peak_size's)


SCALES = {
    "seed": Scale(400, 16, 8, 32, 128, 64, None, seed_shape.QUESTION_MEAN_TOKENS, seed_shape.QUESTION_TOKENS_RANGE,
                  {}, {}),
    "tiny": Scale(6, 2, 2, 4, 8, 6, 4, 4, (1, 8),
                  {"vocab_size": 1024, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512},
                  {"rollouts": 16, "max_tokens": 16, "eval_size": 10, "threads": 1}, peak_size=256),
}
#: the goals of a seed-scale step on one H200
GOALS = {"step_s_at_mean": ("<=", 12.0, "s/step at the drawn lengths (mean 400)"),
         "tokens_per_s_at_256": (">=", 30000.0, "generated tokens/s at 256 sequences at once (the full-length step)"),
         "engine_over_hf_generate_at_32": (">=", 20.0, "the engine over HF generate at batch 32")}
REWARD_SEED, LENGTH_SEED, PROMPT_SEED = 11, 12, 13


def seed_settings(math_yaml: Path, device: str, decode: str, **over) -> tuple[TrainConfig, dict]:
    """``(TrainConfig, {"eval_size", "eval_max_tokens"})`` of ``math_yaml``'s MATH track on ``device``
    (old log-probs recomputed, as ``rlpipe train`` resolves them for an HF policy), with ``over``'s
    ``rollouts``, ``max_tokens`` and ``eval_size`` for a smaller shape."""
    try:
        math_cfg = yaml.safe_load(Path(math_yaml).read_text())["math"]
        train = dict(math_cfg["train"])
    except (OSError, KeyError, TypeError) as e:
        raise ValueError(f"{math_yaml}: no math.train section to take seed 001's settings from ({e})") from e
    train.update(device=device, decode=decode, recompute_old_log_probs=True, n_grpo_steps=1, val_every=1,
                 checkpoint_every=1, log_rollouts_every=1, threads=int(train.get("threads", 4)))
    if "rollouts" in over:
        micro = train["train_batch_size"] // train["gradient_accumulation_steps"]
        train.update(rollout_batch_size=over["rollouts"], train_batch_size=over["rollouts"],
                     gradient_accumulation_steps=over["rollouts"] // micro)
    if "threads" in over:
        train["threads"] = over["threads"]
    if "max_tokens" in over:
        train["sampling_max_tokens"] = over["max_tokens"]
    size = {"eval_size": over.get("eval_size", math_cfg.get("eval_size", 5000)),
            "eval_max_tokens": over.get("max_tokens", math_cfg.get("eval_max_tokens", 1024))}
    return TrainConfig(**train), size


class _DrawnRewards:
    """A task whose reward is the drawn one each row carries as its ground truth."""
    stop = ("</answer>",)
    include_stop_str_in_output = True

    @staticmethod
    def reward(response: str, ground_truth: float) -> dict[str, float]:
        return {"reward": float(ground_truth)}


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _timed(device: torch.device, fn):
    t0 = _sync(device)
    out = fn()
    return out, _sync(device) - t0


def sample(gen: Generator, prompts: list[list[int]], n: int, max_tokens: int, caps: list[int] | None, seed: int,
           min_tokens: int | None = None):
    """``generate`` on the generator's model as ``Generator`` samples (its settings, ``train.decode``,
    autocast), ``n`` samples per prompt, row ``i`` capped at ``caps[i]``."""
    c = gen.cfg
    params = SamplingParams(n=n, temperature=c.sampling_temperature, top_p=c.sampling_top_p, max_tokens=max_tokens,
                            min_tokens=c.sampling_min_tokens if min_tokens is None else min_tokens, stop=gen.stop,
                            include_stop_str_in_output=gen.include_stop, seed=seed)
    with torch.inference_mode(), autocast(gen.device, c.dtype):
        return generate(gen.model, gen.tokenizer, prompts, params, device=gen.device, decode=c.decode,
                        row_max_tokens=caps)


def decode_work(cfg, prompt_lens: list[int], group: int, response_lens: list[int]) -> float:
    """Useful FLOPs of generating ``response_lens`` (prompt-major rows, ``group`` per prompt): each
    prompt's prefill once, then every row's tokens, token ``i`` attending to ``prompt + i`` positions."""
    per_token, attn = 2 * matmul_params(cfg), 4 * cfg.num_hidden_layers * cfg.hidden_size
    steps = sum(t * per_token + attn * (t * prompt_lens[r // group] + t * (t + 1) / 2)
                for r, t in enumerate(response_lens))
    return forward_flops(cfg, prompt_lens) + float(steps)


def grpo_step(gen: Generator, learner: Learner, prompts: list[list[int]], caps: list[int], step: int) -> dict:
    """One colocated GRPO step, timed; its record. The phases:

    - ``generate``: ``rlpipe.lm.sampler.generate`` on the generator's model as ``Generator`` calls it
      (its sampling settings, ``train.decode``, bf16 autocast), prompts of r1_zero length, each row
      capped at a drawn length (``row_max_tokens``; ``seed_shape``: mean 400, the longest reach 1024);
    - ``score``: rewards drawn with a fixed seed (0 or 1, even odds) through ``rlpipe.rl.scoring.score_batch``,
      so advantages are non-zero (the MATH grader would score random text 0; grading real text costs more);
    - ``old_logprobs``: ``Learner.recompute_old_logprobs``;
    - ``update``: ``Learner.train_step`` (128 micro-batches, clipping, AdamW);
    - ``hand_off``: ``copy_weights`` from the learner into the generator, as ``ColocatedWorker.sync_weights``.

    Each phase is timed between device synchronisations; ``other`` is the rest of the step's wall time
    (the rollout batch's host records between the phases), so the phases add up to ``step_s``. Each step
    reports s/step and its phase split, generated tokens/s, each phase's useful FLOP/s as a fraction of
    the device peak (``rlpipe.bench.flops``: the prefill once per prompt and the decode's tokens; the
    log-prob and update passes over the sequences without their padding) and ``peak_memory_gib``
    (``max_memory_allocated`` over the step, both copies of the weights held)."""
    c, dev = learner.cfg, learner.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    rewards = torch.Generator().manual_seed(REWARD_SEED + step)
    drawn = torch.randint(0, 2, (len(caps),), generator=rewards).tolist()
    secs: dict[str, float] = {}
    start = _sync(dev)
    out, secs["generate"] = _timed(dev, lambda: sample(gen, prompts, c.group_size, c.sampling_max_tokens, caps,
                                                      seed=step))
    g = c.group_size
    batch = RolloutBatch(prompts=[gen.tokenizer.decode(p) for p in prompts for _ in range(g)], ground_truths=drawn,
                         prompt_ids=out.prompt_ids, response_ids=out.response_ids, responses=out.response_text,
                         behaviour_logprobs=[lp.detach().float().cpu() for lp in out.logprobs],
                         finish_reasons=out.finish_reason, policy_version=learner.version, group_size=g)
    batch, secs["score"] = _timed(dev, lambda: score_batch(batch, _DrawnRewards, c))
    batch, secs["old_logprobs"] = _timed(dev, lambda: learner.recompute_old_logprobs(batch, step))
    results, secs["update"] = _timed(dev, lambda: [learner.train_step(b, None, step)
                                                   for b in train_batches(batch, c, step)])
    sync, secs["hand_off"] = _timed(dev, lambda: copy_weights(learner.model, gen.model, version=learner.version))
    gen.mark_loaded(learner.version)
    secs["other"] = _sync(dev) - start - sum(secs.values())  # the batch's records, between the phases
    lens = [len(r) for r in out.response_ids]
    rec = {"rows": len(lens), "prompts": len(prompts), "step_s": round(sum(secs.values()), 3),
           "phases_s": {k: round(v, 4) for k, v in secs.items()}, "generated_tokens": sum(lens),
           "tokens_per_s": round(sum(lens) / secs["generate"], 1), "response_mean": round(sum(lens) / len(lens), 1),
           "response_max": max(lens), "finish_reasons": {r: out.finish_reason.count(r)
                                                          for r in sorted(set(out.finish_reason))},
           "hand_off_bytes": sync.bytes, "hand_off_gbps": round(sync.bytes / secs["hand_off"] / 1e9, 2),
           "loss_policy": results[-1].metrics.get("loss/policy")}
    if dev.type == "cuda":
        rec["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    rec["work"] = _step_work(gen.model.config, out.prompt_ids[::g], g, lens, secs)
    return rec


def _step_work(cfg, prompt_lens_ids, group: int, lens: list[int], secs: dict) -> dict:
    """Each phase's useful FLOPs (``*_gflop``), before the device peak is known."""
    p = [len(x) for x in prompt_lens_ids]
    seqs = [p[r // group] + t - 1 for r, t in enumerate(lens)]  # (B,): the packed (B, T-1) rows, unpadded
    head = sum(lens)
    work = {"generate": decode_work(cfg, p, group, lens), "old_logprobs": forward_flops(cfg, seqs, head_tokens=head),
            "update": train_flops(cfg, seqs, head_tokens=head)}
    return {f"{k}_gflop": gflops(v) for k, v in work.items()} | {"step_gflop": gflops(sum(work.values()))}


def with_fractions(rec: dict, peak: dict) -> dict:
    """``rec`` with each phase's useful FLOP/s as a fraction of the device peak (and the step's)."""
    w, s = rec["work"], rec["phases_s"]
    rec["fraction_of_device_peak"] = {ph: fraction(w[f"{ph}_gflop"] * 1e9 / s[ph], peak["flops_per_s"])
                                      for ph in ("generate", "old_logprobs", "update")}
    rec["fraction_of_device_peak"]["step"] = fraction(w["step_gflop"] * 1e9 / rec["step_s"], peak["flops_per_s"])
    return rec


def headline(rec: dict, peak: dict, device: torch.device) -> dict:
    """The bench's two fractions (``peak_fields``): the step at the drawn lengths, all its useful work
    over its seconds, against the shape peak (measured here) and the device peak."""
    shape = matmul_peak(device=device)["flops_per_s"]
    return {**peak_fields(rec["work"]["step_gflop"] * 1e9 / rec["step_s"], shape, peak),
            "peak_note": PEAK_NOTE + " Here: the last step at the drawn lengths (steps_at_mean), its useful FLOPs "
                         "(prefill once per prompt, decode, log-probs and forward/backward over the sequences "
                         "without padding; gradient checkpointing's recomputation not counted) over its seconds; "
                         "each step's fraction_of_device_peak gives its phases'."}


def engine_vs_hf(gen: Generator, scale: Scale) -> dict:
    """Tokens/s of the engine and of HF ``generate`` at ``hf_rows`` rows of ``hf_prompt`` tokens, every
    row ``hf_tokens`` long (EOS masked for both), each after one untimed call of the same shape."""
    rows, tokens, vocab = scale.hf_rows, scale.hf_tokens, gen.model.config.vocab_size
    prompts = seed_shape.random_prompts([scale.hf_prompt] * rows, vocab, PROMPT_SEED)
    for _ in range(2):
        _, engine_s = _timed(gen.device, lambda: sample(gen, prompts, 1, tokens, None, seed=1, min_tokens=tokens))
    ids = torch.tensor(prompts, device=gen.device)
    with autocast(gen.device, gen.cfg.dtype):
        hf_s = hf_generate_s(gen.model, gen.device, ids, tokens)
    out = {"rows": rows, "prompt_tokens": scale.hf_prompt, "new_tokens": tokens, "decode": gen.cfg.decode,
           "engine_s": round(engine_s, 4), "hf_generate_s": round(hf_s, 4),
           "engine_tokens_per_s": round(rows * tokens / engine_s, 1),
           "hf_generate_tokens_per_s": round(rows * tokens / hf_s, 1)}
    out["engine_over_hf_generate"] = round(hf_s / engine_s, 2)
    return out


def eval_projection(gen: Generator, scale: Scale, size: dict) -> dict:
    """The zero-shot evaluation's time for ``eval_size`` prompts of up to ``eval_max_tokens``, PROJECTED
    (not measured) from two chunks of ``rlpipe eval``'s size (``evaluate.CUDA_CHUNK`` prompts on a GPU),
    one sample each, through the same call: the first with the engine's allocation and capture, the
    second warm (prompts of the same lengths, other tokens; responses of other drawn lengths); the
    projection is the first plus the remaining chunks at the second's time. Grading is not included."""
    chunk = scale.eval_chunk or (evaluate.CUDA_CHUNK if gen.device.type == "cuda" else evaluate.CHUNK)  # eval's own
    n, max_tokens, vocab = size["eval_size"], size["eval_max_tokens"], gen.model.config.vocab_size
    secs, tokens = [], 0
    lens = seed_shape.prompt_lengths(chunk, PROMPT_SEED + 1, scale.question_mean, scale.question_range)
    for i in range(2):
        prompts = seed_shape.random_prompts(lens, vocab, PROMPT_SEED + 10 + i)
        caps = seed_shape.clipped_lengths(chunk, scale.mean_tokens, scale.min_tokens, max_tokens, LENGTH_SEED + i)
        out, s = _timed(gen.device, lambda: sample(gen, prompts, 1, max_tokens, caps, seed=100 + i))  # noqa: B023
        secs.append(s)
        tokens += sum(len(r) for r in out.response_ids)
    chunks = math.ceil(n / chunk)
    projected = secs[0] + (chunks - 1) * secs[1]
    return {"prompts": n, "max_tokens": max_tokens, "chunk": chunk, "chunks": chunks, "decode": gen.cfg.decode,
            "measured_chunk_s": [round(s, 3) for s in secs], "measured_tokens": tokens,
            "measured_tokens_per_s": round(tokens / sum(secs), 1), "projected_s": round(projected, 1),
            "note": f"projected, not measured: the first chunk (with the engine's capture) plus {chunks - 1} "
                    "chunks at the second's time; responses of the drawn lengths, grading not included"}


def goals(result: dict, applies: bool) -> dict:
    """Each goal's value, target and whether it is met (null where it does not apply)."""
    values = {"step_s_at_mean": (result.get("steps_at_mean") or [{}])[-1].get("step_s"),
              "tokens_per_s_at_256": (result.get("steps_at_max") or [{}])[-1].get("tokens_per_s"),
              "engine_over_hf_generate_at_32": (result.get("engine_vs_hf") or {}).get("engine_over_hf_generate")}
    out = {}
    for name, (op, target, what) in GOALS.items():
        v = values[name]
        met = None if v is None or not applies else (v <= target if op == "<=" else v >= target)
        out[name] = {"what": what, "value": v, "goal": f"{op} {target:g}", "met": met}
    return out


def build(cfg: TrainConfig, model_cfg, device: torch.device, work_dir: Path | None = None):
    """``(generator, learner)``: the pipeline's roles loaded from a random-weight policy directory of
    ``model_cfg``, written in a temporary folder under ``work_dir`` and removed once both are loaded."""
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        torch.manual_seed(cfg.seed)  # the random weights, the same in every run
        policy = seed_shape.write_policy_dir(model_cfg, Path(tmp) / "policy", device)
        gen = Generator(str(policy), cfg, stop=_DrawnRewards.stop, include_stop=True, threads=cfg.threads)
        return gen, Learner(str(policy), cfg, threads=cfg.threads)


def _settings(cfg: TrainConfig, scale: Scale) -> dict:
    return {"rollouts": cfg.rollout_batch_size, "group_size": cfg.group_size, "max_tokens": cfg.sampling_max_tokens,
            "mean_tokens": scale.mean_tokens, "micro_batch_rows": cfg.derived().micro_train_batch_size,
            "dtype": cfg.dtype, "master_weights": cfg.master_weights, "decode": cfg.decode,
            "lengths": "quantiles of a gamma of shape 2 clipped to [min, max], mean as given (rlpipe.bench.seed_shape)"}


def measure(device: torch.device, out: Path, shape: str = "seed", steps: int = 1, decode: str = "auto",
            math_yaml: Path = Path("config/math.yaml"), work_dir: Path | None = None) -> dict:
    """The part's record, rewritten to ``out`` after each measurement (``status`` names the next one).
    Order: warm-up, the steps at the drawn lengths, the full-length steps, the engine against HF,
    the evaluation. The steps come first and together: they share the engine's KV arena (one per
    shape, a few kept per model), which the other shapes could evict and make a step capture again.

    In detail: a warm-up step (the same rows capped at a few tokens: it captures the decode's graphs
    and allocates AdamW's state; recorded as ``warmup``, in no goal); ``steps`` steps at the drawn
    lengths (``steps_at_mean``); ``steps`` steps where every row runs the full 1024 tokens
    (``steps_at_max``: the worst case, without a goal of its own; its generation gives the tokens/s at
    256 sequences at once); the generation engine against HF ``generate`` at batch 32 (the same
    prompts, every row the same number of tokens, each after a warm-up call); the zero-shot evaluation
    at ``config/math.yaml``'s size (``eval_projection``). The goals (seed scale on one GPU) are checked
    in ``goals``: ``met`` is null where they do not apply (another shape, or no CUDA device)."""
    scale = SCALES[shape]
    cfg, size = seed_settings(math_yaml, str(device), decode, **scale.train)
    model_cfg = qwen_config(**scale.model)
    applies = shape == "seed" and device.type == "cuda"
    result = {"model": "Qwen2.5-Math-1.5B shape, random weights", "shape": shape,
              "config": {**QWEN_MATH_1_5B, **scale.model}, "device": str(device), "settings": _settings(cfg, scale)}

    def save(status: str) -> None:
        result.update(status=status, goals=goals(result, applies))
        write_json(out, result)

    save("building")
    t0 = time.perf_counter()
    gen, learner = build(cfg, model_cfg, device, work_dir)
    result["build_s"] = round(time.perf_counter() - t0, 2)
    result["parameters"] = sum(p.numel() for p in learner.model.parameters())
    result["settings"]["decode_resolved"] = resolve(cfg.decode, gen.model, gen.device)  # what "auto" ran
    n_prompts = cfg.rollout_batch_size // cfg.group_size
    prompt_lens = seed_shape.prompt_lengths(n_prompts, PROMPT_SEED, scale.question_mean, scale.question_range)
    prompts = seed_shape.random_prompts(prompt_lens, model_cfg.vocab_size, PROMPT_SEED)
    caps = seed_shape.clipped_lengths(cfg.rollout_batch_size, scale.mean_tokens, scale.min_tokens,
                                      cfg.sampling_max_tokens, LENGTH_SEED)
    result["prompt_tokens"] = {"mean": round(sum(prompt_lens) / n_prompts, 1), "max": max(prompt_lens)}
    # the device peak in the compute dtype on a GPU; on CPU, whose HF policies hold fp32 weights, fp32
    peak = device_peak(device, cfg.dtype if device.type == "cuda" else "float32", size=scale.peak_size)
    result["device_peak"] = peak
    n = iter(range(1, 10**6))
    save("warmup")
    result["warmup"] = [with_fractions(grpo_step(gen, learner, prompts, [min(c, scale.warmup_tokens) for c in caps],
                                                 next(n)), peak)]
    for key, row_caps in (("steps_at_mean", caps), ("steps_at_max", [cfg.sampling_max_tokens] * len(caps))):
        for _ in range(steps):
            save(key)
            result.setdefault(key, []).append(with_fractions(grpo_step(gen, learner, prompts, row_caps, next(n)), peak))
        if key == "steps_at_mean":
            result |= headline(result["steps_at_mean"][-1], peak, device)
    save("engine_vs_hf")
    result["engine_vs_hf"] = engine_vs_hf(gen, scale)
    save("eval")
    result["eval"] = eval_projection(gen, scale, size)
    print(f"zero-shot evaluation, {size['eval_size']} prompts x up to {size['eval_max_tokens']} tokens: "
          f"{result['eval']['projected_s']:.0f} s (projected from two measured chunks of {result['eval']['chunk']})")
    save("done")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlpipe.bench.seed_step", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the part's JSON (rewritten atomically after each measurement)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", choices=list(SCALES), default="seed", help="seed: the seed's; tiny: the tests'")
    ap.add_argument("--steps", type=int, default=1, help="measured steps at the drawn lengths, and at the maximum")
    ap.add_argument("--decode", default="auto", help="train.decode for the generator (auto: cudagraph on CUDA)")
    ap.add_argument("--math-config", default="config/math.yaml", help="the MATH track's overlay (seed 001's settings)")
    ap.add_argument("--work-dir", default=None, help="where the random-weight policy directory is written")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")
    if a.steps < 1:
        ap.error(f"--steps must be >= 1, got {a.steps}")
    if not Path(a.math_config).is_file():
        ap.error(f"--math-config: {a.math_config} does not exist (run from the project root)")
    measure(device, Path(a.out), a.shape, a.steps, a.decode, Path(a.math_config), a.work_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
