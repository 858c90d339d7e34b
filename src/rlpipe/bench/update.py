"""``rlpipe bench update``: the learner's update phase against a same-run matmul peak.

Prints ONE JSON line (and with ``--out`` also writes it atomically). It builds the real
``rlpipe.trainer.actors.learner.Learner`` on ``--checkpoint`` (the workflow passes the pipeline's
base model) or on a randomly initialised ``TransformerLM`` of ``--preset`` (vocabulary from a BPE
trained here on synthetic text), and a synthetic scored rollout batch of
``--batch`` rows, each ``--prompt-tokens`` + ``--response-tokens`` long, and times the three parts
of one ``Learner.train_step`` separately, in the order ``train_step`` runs them:

- ``fwd_bwd``: ``_accumulate_gradients`` (forward with token entropy, GRPO-Clip loss, backward, over
  ``gradient_accumulation_steps`` microbatches): 3x the forward FLOPs (``rlpipe.bench.flops``);
- ``optimizer``: gradient clipping, AdamW and the finiteness check (elementwise; no matmul FLOPs);
- ``kl_monitor``: the post-step ``no_grad`` forward for KL(pi_t || pi_{t-1}) (seed 000 §3.2):
  1x the forward.

Peak memory: ``fwd_bwd_peak_mb`` is the peak of torch's CPU allocations live during one
``_accumulate_gradients`` above what was live before it (the profiler's memory events, summed in
time order), with the LM head on the response tokens only (``train.response_only_head``, the
default), and ``full_head_fwd_bwd_peak_mb`` the same with the head, log-softmax and entropy over
every position (the seeds' ``get_response_log_probs``); ``peak_memory_ratio`` is full / response-only.

Each part's time is the median over ``--repeats`` steps after one warm-up step. Achieved FLOP/s is
counted FLOPs / median time; ``*_fraction_of_peak`` divides it by the best square fp32 matmul rate
measured in the same process on the same threads, before and after the steps (both are reported;
the larger is the peak: the shape peak). ``*_fraction_of_device_peak`` and ``fraction_of_device_peak``
divide the same FLOP/s by the device peak (``rlpipe.bench.flops.device_peak``: one large square
matmul in the run's ``--dtype``), ``fraction_of_shape_peak`` repeats the update's shape-peak
fraction, and ``peak_note`` says which is which. ``--device cuda`` runs the learner on the GPU
(``train.device``; ``--dtype bfloat16`` is its autocast); the peak memory there is
``torch.cuda.max_memory_allocated`` above what was allocated before. Nothing is downloaded. The
1-minute load average is reported because the CPU may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from rlpipe.bench import emit
from rlpipe.bench.flops import (
    device_peak,
    forward_flops,
    fraction,
    gflops,
    matmul_peak,
    peak_fields,
    train_flops,
)
from rlpipe.bench.sampler import bench_tokenizer
from rlpipe.config import TrainConfig
from rlpipe.lm.checkpoint import load_checkpoint, save_checkpoint
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.rl.records import RolloutBatch
from rlpipe.trainer.actors.learner import Learner, build_train_tensors

PARTS = ("fwd_bwd", "optimizer", "kl_monitor")
GOAL_FRACTION_OF_PEAK = 0.5  # the whole update's useful FLOP/s against the same-run matmul peak


def synthetic_batch(batch: int, group: int, prompt_tokens: int, response_tokens: int, vocab: int,
                    seed: int = 0) -> RolloutBatch:
    """A scored on-policy-shaped batch: random token ids, behaviour log-probs near -log V, binary
    rewards with GRPO advantages per group (so the clip and the ratio have real work to do)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, vocab, (prompt_tokens,), generator=g).tolist() for _ in range(batch)]
    responses = [torch.randint(1, vocab, (response_tokens,), generator=g).tolist() for _ in range(batch)]
    behaviour = [-torch.rand(response_tokens, generator=g) - float(torch.tensor(vocab).log()) + 0.5
                 for _ in range(batch)]  # (B,) each (T_i,)
    rewards = torch.randint(0, 2, (batch,), generator=g).float()  # (B,)
    grouped = rewards.view(-1, group)  # (B/G, G)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)  # (B,)
    return RolloutBatch(prompts=[""] * batch, ground_truths=[None] * batch, prompt_ids=prompts,
                        response_ids=responses, responses=[""] * batch, behaviour_logprobs=behaviour,
                        finish_reasons=["length"] * batch, policy_version=0, group_size=group,
                        rewards=rewards, advantages=adv)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_step(learner: Learner, batch: RolloutBatch, step: int) -> dict[str, float]:
    """One ``train_step``, its three parts timed (the same calls in the same order)."""
    t = build_train_tensors(batch, learner.pad_id).to(learner.device)
    out = {}
    _sync(learner.device)  # on a GPU each part's clock stops when its kernels have run, not when launched
    t0 = time.perf_counter()
    sums, pre_lp = learner._accumulate_gradients(t, None, step)
    _sync(learner.device)
    t1 = time.perf_counter()
    learner._optimizer_step(step, sums)
    _sync(learner.device)
    t2 = time.perf_counter()
    {k: float(v) for k, v in learner._kl_metrics(t, pre_lp, None).items()}  # read on the host, as the step does
    _sync(learner.device)
    t3 = time.perf_counter()
    out["fwd_bwd"], out["optimizer"], out["kl_monitor"] = t1 - t0, t2 - t1, t3 - t2
    return out


def allocation_peak_bytes(fn, device: torch.device | str = "cpu") -> int:
    """Peak bytes of torch CPU allocations live during ``fn()`` above those live before it: each
    op's own allocations net of its frees (``self_cpu_memory_usage``) and the frees outside any op,
    summed in time order. An op's temporary that it frees before returning is not seen. On CUDA:
    the caching allocator's peak during ``fn()`` above what was allocated before."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def _peak_memory(learner: Learner, batch: RolloutBatch) -> dict[str, float]:
    """``_accumulate_gradients``' allocation peak with the response-only head and with the full head."""
    t = build_train_tensors(batch, learner.pad_id).to(learner.device)
    cfg, out = learner.cfg, {}
    try:
        for key, only in (("fwd_bwd_peak_mb", True), ("full_head_fwd_bwd_peak_mb", False)):
            learner.cfg = cfg.model_copy(update={"response_only_head": only})
            out[key] = round(allocation_peak_bytes(lambda: learner._accumulate_gradients(t, None, 0),
                                                   learner.device) / 2**20, 2)
            learner.opt.zero_grad(set_to_none=True)
    finally:
        learner.cfg = cfg
    out["peak_memory_ratio"] = round(out["full_head_fwd_bwd_peak_mb"] / out["fwd_bwd_peak_mb"], 2)
    return out


def _learner(preset: str, checkpoint: str | None, batch: int, group: int, grad_accum: int, response_tokens: int,
             threads: int, tmp: str, device: str = "cpu", dtype: str = "float32") -> tuple[Learner, ModelConfig]:
    """The learner of ``checkpoint`` (the pipeline's base), else of a random ``preset`` model."""
    if checkpoint:
        ckpt, cfg = checkpoint, load_checkpoint(checkpoint).model_config
        if cfg is None:
            raise ValueError(f"--checkpoint {checkpoint}: an HF model; FLOPs are counted for TransformerLM only")
    else:
        tok = bench_tokenizer(min(ModelConfig.from_preset(preset).vocab_size, 2048), tmp)
        cfg = ModelConfig.from_preset(preset, vocab_size=tok.vocab_size)
        torch.manual_seed(0)
        ckpt = os.path.join(tmp, "model.pt")
        save_checkpoint(ckpt, TransformerLM(cfg), tokenizer=tok)
    train_cfg = TrainConfig(rollout_batch_size=batch, train_batch_size=batch, group_size=group,
                            gradient_accumulation_steps=grad_accum, sampling_max_tokens=response_tokens,
                            device=device, dtype=dtype)
    return Learner(ckpt, train_cfg, threads=threads), cfg


def run_bench(preset: str, checkpoint: str | None, batch: int, group: int, grad_accum: int, prompt_tokens: int,
              response_tokens: int, repeats: int, threads: int, device: str = "cpu", dtype: str = "float32") -> dict:
    dev = torch.device(device)
    peak_before = matmul_peak(device=dev)
    chip = device_peak(dev, dtype)
    with tempfile.TemporaryDirectory() as tmp:
        learner, cfg = _learner(preset, checkpoint, batch, group, grad_accum, response_tokens, threads, tmp,
                                device, dtype)
        data = synthetic_batch(batch, group, prompt_tokens, response_tokens, cfg.vocab_size)
        learner.train_step(data, None, 0)  # warm-up through the public entry point
        times = [_timed_step(learner, data, s) for s in range(1, repeats + 1)]
        memory = _peak_memory(learner, data)
    peak_after = matmul_peak(device=dev)
    peak = max(peak_before["flops_per_s"], peak_after["flops_per_s"])
    med = {p: statistics.median(t[p] for t in times) for p in PARTS}
    lens = [prompt_tokens + response_tokens] * batch
    head = batch * response_tokens  # the log-probs are needed at the response tokens only
    flops = {"fwd_bwd": train_flops(cfg, lens, head), "optimizer": 0.0, "kl_monitor": forward_flops(cfg, lens, head)}
    total_s = sum(med.values())
    out = {
        "bench": "update", "model": checkpoint or preset, "device": str(dev), "dtype": dtype, "batch": batch,
        "group_size": group,
        "gradient_accumulation_steps": grad_accum, "prompt_tokens": prompt_tokens,
        "response_tokens": response_tokens, "repeats": repeats, "num_parameters": cfg.num_parameters(),
        "torch_threads": torch.get_num_threads(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "matmul_peak_gflops": gflops(peak), "matmul_peak_size": peak_before["size"],
        "matmul_peak_gflops_before": gflops(peak_before["flops_per_s"]),
        "matmul_peak_gflops_after": gflops(peak_after["flops_per_s"]),
        "update_s": round(total_s, 5), "update_gflops": gflops(sum(flops.values()) / total_s),
        "update_fraction_of_peak": round(sum(flops.values()) / total_s / peak, 4),
        "update_fraction_of_device_peak": fraction(sum(flops.values()) / total_s, chip["flops_per_s"]), **memory,
        **peak_fields(sum(flops.values()) / total_s, peak, chip),
    }
    out["goals"] = {"update_fraction_of_peak": GOAL_FRACTION_OF_PEAK,
                    "met": out["update_fraction_of_peak"] >= GOAL_FRACTION_OF_PEAK}
    for p in PARTS:
        out[f"{p}_s"] = round(med[p], 5)
        out[f"{p}_share"] = round(med[p] / total_s, 4)
        if flops[p]:
            out[f"{p}_gflops"] = gflops(flops[p] / med[p])
            out[f"{p}_fraction_of_peak"] = round(flops[p] / med[p] / peak, 4)
            out[f"{p}_fraction_of_device_peak"] = fraction(flops[p] / med[p], chip["flops_per_s"])
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="rlpipe bench update", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu-tiny", help="a random model of this preset (without --checkpoint)")
    ap.add_argument("--checkpoint", default=None, help="an rlpipe checkpoint to train (the pipeline's base)")
    ap.add_argument("--batch", type=int, default=32, help="train batch rows (B)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=20)
    ap.add_argument("--response-tokens", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (a learner's train.threads)")
    ap.add_argument("--device", default="cpu", help="the learner's device (train.device): cpu, cuda, cuda:N")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the learner's train.dtype (bfloat16: autocast on CUDA); the device peak is taken in it")
    ap.add_argument("--out", default=None, help="also write the JSON line here (atomically)")
    args = ap.parse_args(argv)
    for name in ("batch", "group_size", "grad_accum", "prompt_tokens", "response_tokens", "repeats", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.batch % args.group_size or args.batch % args.grad_accum:
        ap.error(f"--batch ({args.batch}) must be divisible by --group-size ({args.group_size}) "
                 f"and --grad-accum ({args.grad_accum})")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: CUDA is not available here (torch {torch.__version__})")
    torch.set_num_threads(args.threads)
    if args.checkpoint and not os.path.isfile(args.checkpoint):
        ap.error(f"--checkpoint: {args.checkpoint} does not exist")
    result = run_bench(args.preset, args.checkpoint, args.batch, args.group_size, args.grad_accum, args.prompt_tokens,
                       args.response_tokens, args.repeats, args.threads, args.device, args.dtype)
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
