"""The two timed sides of ``rlpipe bench trl``: TRL's ``GRPOTrainer`` in this process (``run_trl``)
and ``rlpipe train`` in a subprocess, as the workflow runs it (``run_rlpipe``), each trained once
and read back into the same record (wall, samples, tokens, their rates, the per-step median,
rewards, ``phases_s_per_step``, the load before and after). What each side's clock covers is in
``run_trl`` and ``read_rlpipe_run``; the pairs, ratios and notes are ``rlpipe.bench.trl``'s.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from rlpipe.bench.phase_split import PhaseClock, rlpipe_phase_split
from rlpipe.bench.trl_settings import (
    BenchSettings,
    _load,
    _policy_reward,
    grpo_config_kwargs,
    prompt_sequence,
    rlpipe_train_overrides,
    validation_reward,
)
from rlpipe.config import apply_overrides, load_yaml
from rlpipe.contract import CHECKPOINT_FILE, METRICS_FILE, RUN_INFO_FILE
from rlpipe.lm.attention import route_hf_attention
from rlpipe.lm.tokenizer import load_tokenizer
from rlpipe.tasks.keyword.reward import keyword_inclusion_reward_fn

RLPIPE_VARIANT = "bench_trl"


# --------------------------------------------------------------------------- TRL side


class KeywordReward:
    """The keyword-inclusion reward as a TRL reward function: TRL calls it with the completions,
    their token ids and the dataset columns (``keywords``) as keyword arguments. It also counts the
    generated tokens and samples (the tokens/s numerator) and keeps the rewards."""

    __name__ = "keyword_inclusion"

    def __init__(self) -> None:
        self.tokens = 0
        self.rewards: list[float] = []

    def __call__(self, prompts, completions, completion_ids, keywords, **kwargs) -> list[float]:

        out = [float(keyword_inclusion_reward_fn(c, k)["reward"]) for c, k in zip(completions, keywords, strict=True)]
        self.tokens += sum(len(ids) for ids in completion_ids)
        self.rewards += out
        return out


def _check_prompt_tokens(tokenizer_hf, tokenizer_ours, rows: list[dict]) -> None:
    """TRL tokenizes prompts with the exported HF tokenizer: it must give our token ids."""
    for r in rows[:16]:
        ours, theirs = tokenizer_ours.encode(r["prompt"]), tokenizer_hf(text=r["prompt"])["input_ids"]
        if list(theirs) != list(ours):
            raise RuntimeError(f"the exported HF tokenizer encodes {r['prompt']!r} as {theirs}, rlpipe as {ours}")


def run_trl(hf_dir: str, dataset: str, s: BenchSettings, work: Path) -> dict:
    """Train ``hf_dir`` with TRL's GRPOTrainer on rlpipe's prompt sequence (``prompt_sequence``, with
    ``shuffle_dataset=False``: optimizer step s trains on the same P prompts as rlpipe's, each
    sampled G times); on ``cuda`` through accelerate (``use_cpu=False``), fp32.

    The clock covers ``trainer.train()`` only: model and tokenizer loading and ``GRPOTrainer``
    construction are outside it, the dataloader and optimizer set-up inside ``train()`` within.
    samples/s = steps x P x G / wall; tokens/s = the generated response tokens ``KeywordReward``
    counted (EOS included, as rlpipe counts it) / wall; the per-step median samples/s comes from a
    callback's step-end clock (``PhaseClock``), which also times ``generate`` and the reward calls
    (``phases_s_per_step``; TRL itself is unchanged). The final validation reward is
    ``validation_reward``, the path rlpipe's side is scored by too."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer


    torch.set_num_threads(s.threads)
    rows = prompt_sequence(dataset, s)
    tok_hf = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    tok_ours = load_tokenizer(hf_dir)
    _check_prompt_tokens(tok_hf, tok_ours, rows)
    route_hf_attention()  # both sides' attention takes the same routing (rlpipe.lm.attention)
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, local_files_only=True).to(s.device)
    reward, clock = KeywordReward(), PhaseClock()
    model.generate = clock.wrap(model.generate, "generate")  # TRL generates with this very object on CPU
    trainer = GRPOTrainer(model=model, reward_funcs=[clock.wrap(reward, "score")],
                          args=GRPOConfig(**grpo_config_kwargs(s, str(work))), train_dataset=Dataset.from_list(rows),
                          processing_class=tok_hf, callbacks=[clock.callback()])
    load_before = _load()
    t0 = time.perf_counter()
    trainer.train()
    if s.device != "cpu":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    load_after = _load()
    if len(clock.steps) != s.steps:
        raise RuntimeError(f"TRL ran {len(clock.steps)} optimizer steps, expected {s.steps}")
    phases = clock.split()
    if phases["generate"] <= 0:
        raise RuntimeError("TRL's generation was not timed: GRPOTrainer no longer calls the model's generate")
    samples = s.steps * s.samples_per_step
    final = validation_reward(trainer.model.eval(), tok_ours, dataset, s)
    return {"wall_s": round(wall, 3), "samples": samples, "tokens": reward.tokens,
            "samples_per_s": round(samples / wall, 3), "tokens_per_s": round(reward.tokens / wall, 1),
            "step_samples_per_s_median": round(statistics.median(s.samples_per_step / st["step"]
                                                                 for st in clock.steps), 3),
            "phases_s_per_step": phases,
            "train_reward_mean": round(sum(reward.rewards) / len(reward.rewards), 4),
            "val_reward_final": final, "load_avg_before": load_before, "load_avg_after": load_after,
            "model": "LlamaForCausalLM (HF modeling, sdpa attention)", "generation": "HF generate"}


# --------------------------------------------------------------------------- rlpipe side


def _write_run_config(config: str | None, s: BenchSettings, path: Path) -> None:
    """A pipeline config for ``rlpipe train``: ``--config``'s sections, ``train`` overridden with the
    settings, one variant, the job's threads = the bench's threads."""

    data = load_yaml(config) if config else {}
    data["train"] = apply_overrides(data.get("train") or {}, rlpipe_train_overrides(s))
    data["variants"] = {RLPIPE_VARIANT: {"mode": "colocated_sync"}}
    data["workflow"] = dict(data.get("workflow") or {}, threads_per_variant=s.threads, run_tests=False)
    if s.device != "cpu":  # the colocated job declares its one GPU (a cuda run with none is refused)
        data["workflow"]["gpus_per_colocated"] = 1
    data.pop("math", None)
    data["workflow"].pop("tracks", None)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _train(base: str, cfg_path: Path, dataset: str, out: Path, s: BenchSettings, log: Path) -> int:
    cmd = [sys.executable, "-m", "rlpipe.cli", "train", "--config", str(cfg_path), "--variant", RLPIPE_VARIANT,
           "--base", base, "--dataset", dataset, "--out", str(out), "--threads", str(s.threads), "--resume", "never"]
    env = dict(os.environ, OMP_NUM_THREADS=str(s.threads))
    with open(log, "w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, check=False).returncode


RLPIPE_MODELS = {"native": "checkpoint", "hf": "hf_dir"}  # --rlpipe-model -> the base rlpipe trains


def run_rlpipe(checkpoint: str, hf_dir: str, config: str | None, dataset: str, s: BenchSettings,
               work: Path, model: str = "native") -> dict:
    """``rlpipe train`` on ``checkpoint`` (``model`` native: the .pt the HF folder was exported from,
    in rlpipe's own ``TransformerLM``, what ``rlpipe train`` runs for its own models) or on
    ``hf_dir`` (hf: the folder through transformers' Llama code, TRL's modelling code, which
    isolates what the pipeline alone gains); ``base`` in the record says which. It runs in a
    subprocess, as the workflow runs it, with ``--threads`` for its colocated actor; throughput
    comes from its metrics.parquet (``read_rlpipe_run``), the final reward from its last.pt
    through ``validation_reward``, the path TRL's side is scored by too."""

    cfg_path = work / "rlpipe_config.yaml"
    _write_run_config(config, s, cfg_path)
    load_before = _load()
    used = RLPIPE_MODELS[model]
    out, log = work / f"rlpipe_run_{model}", work / f"rlpipe_train_{model}.log"
    rc = _train(checkpoint if used == "checkpoint" else hf_dir, cfg_path, dataset, out, s, log)
    load_after = _load()
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"rlpipe train failed (exit {rc}); log {log}:\n{tail}")
    result = read_rlpipe_run(out, s)
    result.update(base=used, base_path=hf_dir if used == "hf_dir" else checkpoint,
                  load_avg_before=load_before, load_avg_after=load_after,
                  val_reward_final=_policy_reward(str(out / CHECKPOINT_FILE), dataset, s))
    return result


def read_rlpipe_run(run_dir: Path, s: BenchSettings) -> dict:
    """samples/s, tokens/s and per-step median from a run's metrics.parquet and run_info.json.

    rlpipe's clock starts after Ray start-up, model loading and the step-0 validation; the wall
    used is the ``wall_time`` of the last optimizer step, so the final validation and checkpoint
    are outside it. tokens/s sums ``perf/tokens_per_s`` over each step's seconds (generated
    response tokens, EOS included); the per-step median is ``perf/samples_per_s``'s."""
    import pandas as pd


    m = pd.read_parquet(run_dir / METRICS_FILE).sort_values("step")
    info = json.loads((run_dir / RUN_INFO_FILE).read_text())
    steps = m[m["step"] >= 1]
    if len(steps) != s.steps or int(info["total_samples"]) != s.steps * s.samples_per_step:
        raise RuntimeError(f"{run_dir / METRICS_FILE}: {len(steps)} steps / {info['total_samples']} samples, "
                           f"expected {s.steps} / {s.steps * s.samples_per_step}")
    wall = float(steps["wall_time"].iloc[-1])  # last optimizer step; t0 is after the step-0 validation
    dt = m["wall_time"].diff().iloc[1:]
    tokens = int(round(float((steps["perf/tokens_per_s"] * dt.values).sum())))
    samples = int(info["total_samples"])
    val0 = m.loc[m["step"] == 0, "reward/val_mean"]
    return {"wall_s": round(wall, 3), "samples": samples, "tokens": tokens,
            "samples_per_s": round(samples / wall, 3), "tokens_per_s": round(tokens / wall, 1),
            "step_samples_per_s_median": round(float(steps["perf/samples_per_s"].median()), 3),
            "train_reward_mean": round(float(steps["reward/train_mean"].mean()), 4),
            "val_reward_in_run_initial": round(float(val0.iloc[0]), 4) if len(val0) else None,
            "val_reward_in_run_final": round(float(steps["reward/val_mean"].iloc[-1]), 4),
            "phases_s_per_step": rlpipe_phase_split(m),
            "run_wall_time_s": info.get("wall_time_s"), "conditions": info.get("conditions"),
            "run_dir": str(run_dir), "generation": "rlpipe KV-cache sampler"}
