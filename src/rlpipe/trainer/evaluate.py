"""``rlpipe eval``: one sampled response per MATH validation example, graded and written to disk.

This is seed 001's ``evaluate_vllm`` (§3.3, Problem 1 ``math_baseline``): load the MATH validation
examples, format them with the ``r1_zero`` prompt, generate, grade, serialize examples, generations
and scores, and count Problem 1(b)'s three categories ((1) format 1 and answer 1, (2) format 1 and
answer 0, (3) format 0 and answer 0)::

    rlpipe eval --config CONFIG --checkpoint PATH --dataset DIR --out OUT_DIR \\
                [--n N] [--max-tokens M] [--threads T] [--device D] [--seed S]

writes ``OUT_DIR/examples.parquet`` and ``OUT_DIR/summary.json``; their names, columns, category
names and keys are ``rlpipe.contract``'s ``EVAL_*`` block (``rlpipe math-report`` reads them).

Departures from the seed, and why:

- No vLLM (rlpipe has none): ``rlpipe.lm.sampler.generate`` is a vLLM-like sampler with the same
  option names, on our ``TransformerLM`` (an rlpipe ``.pt`` checkpoint) or a local HuggingFace
  directory (``rlpipe.lm.policy.load_policy``, never downloads). Sampling is the seed's:
  temperature 1.0, top-p 1.0, stop at ``</answer>`` kept in the output (the task's ``stop`` and
  ``include_stop_str_in_output``), plus the runs' ``train.sampling_min_tokens``.
- The seed passes a reward function and prompts; here the task does (``rlpipe.tasks.task_for`` on
  the config's train section: ``train.math``'s prompt, ``strict`` and field names), so eval grades
  exactly as the MATH runs' validation does. A config whose ``train.task`` is not ``math`` is
  evaluated with its MATH track's train settings (``rlpipe.config.math_pipeline``), since the
  categories are only defined for a format/answer grader.
- Size: the seed scores all 5K examples with 1024 new tokens; here the first ``math.eval_size``
  validation examples (``--n``) with ``math.eval_max_tokens`` or ``train.sampling_max_tokens``
  (``--max-tokens``): the CPU-sized models have short contexts and the GPU budget is fixed.
- A grader that raises or hangs scores 0 and is counted in ``reward_errors``
  (``rlpipe.rl.reward_guard.guarded_rewards``) instead of losing the whole generation.
- A fixed seed (``--seed``, default ``train.val_seed``). The sampler seeds every row from (seed,
  prompt tokens), so responses do not depend on the chunk size or on what else is in the batch,
  and the same weights give the same responses on either backend (up to float rounding).
- Every input is checked before any generation: the config, the checkpoint path (and that it
  loads), the dataset (every line), the sampling settings, and that every prompt plus
  ``max_tokens`` fits the model's context; the error names the bad file or key.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from rlpipe import io
from rlpipe.config import (
    MATH_TRACK,
    ConfigError,
    PipelineConfig,
    TrainConfig,
    load_config,
    math_pipeline,
)
from rlpipe.contract import (
    EVAL_CATEGORIES,
    EVAL_COLUMNS,
    EVAL_FILES,
    EVAL_FLOAT_COLUMNS,
    EVAL_INT_COLUMNS,
    EVAL_SUMMARY_KEYS,
)
from rlpipe.lm.device import autocast, resolve_device, setup_process
from rlpipe.lm.policy import Policy, load_policy
from rlpipe.lm.sampler import SamplingParams, generate
from rlpipe.rl.reward_guard import guarded_rewards
from rlpipe.tasks import Example, Task, check_task, task_for
from rlpipe.tasks.base import DatasetError
from rlpipe.tasks.registry import TaskLoadError

CHUNK = 64  # prompts per generate() call on a CPU
CUDA_CHUNK = 256  # on a GPU: the engine's batch (rlpipe.lm.hf_decode) runs 256 concurrent rows
TEMPERATURE, TOP_P = 1.0, 1.0  # seed 001 §3.3


class EvalInputError(ValueError):
    """An input of ``rlpipe eval`` is unusable; the message names the file or key."""


@dataclass(frozen=True)
class EvalRequest:
    """What to evaluate; ``None`` fields take the config's defaults (see ``main``)."""

    checkpoint: str | Path
    dataset: str | Path
    n: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    device: str | None = None
    threads: int | None = None
    chunk: int | None = None  # prompts per generate() call; None: CHUNK, or CUDA_CHUNK on a GPU


@dataclass
class Inputs:
    """Everything checked and loaded before the first token is generated."""

    train: TrainConfig
    task: Task
    examples: list[Example]
    params: SamplingParams
    policy: Policy
    device: torch.device
    prompt_ids: list[list[int]]


# ----------------------------------------------------------------------------- inputs


#: Tasks ``rlpipe eval`` does not grade (no format/answer reward split): a config of theirs means the
#: MATH track's settings.
UNGRADED_TASKS = ("keyword_inclusion", "sorting")


def math_train_config(cfg: PipelineConfig) -> TrainConfig:
    """The train section that eval uses: ``cfg.train`` when its task grades answers (math, text, a
    user's task: a track's own config), else the MATH track's (``math_pipeline``)."""
    if cfg.train.task not in UNGRADED_TASKS:
        return cfg.train
    if MATH_TRACK not in cfg.workflow.tracks:
        raise ConfigError(f"train.task is {cfg.train.task!r} and workflow.tracks has no 'math': rlpipe eval grades "
                          "format and answer rewards; for the keyword task use rlpipe eval-base")
    return math_pipeline(cfg).train


def sampling_params(cfg: PipelineConfig, train: TrainConfig, task: Task, req: EvalRequest) -> SamplingParams:
    """Seed 001's evaluation sampling with the task's stop strings; errors name the option."""
    max_tokens = req.max_tokens or cfg.math.eval_max_tokens or train.sampling_max_tokens
    seed = train.val_seed if req.seed is None else req.seed
    if train.sampling_min_tokens > max_tokens:
        raise EvalInputError(f"max tokens {max_tokens} (--max-tokens / math.eval_max_tokens) is below "
                             f"train.sampling_min_tokens {train.sampling_min_tokens}")
    return SamplingParams(n=1, temperature=TEMPERATURE, top_p=TOP_P, max_tokens=max_tokens,
                          min_tokens=train.sampling_min_tokens, stop=task.stop,
                          include_stop_str_in_output=task.include_stop_str_in_output, seed=seed)


def _load_task(train: TrainConfig, dataset: Path) -> Task:
    if not dataset.is_dir():
        raise EvalInputError(f"dataset directory {dataset} does not exist")
    try:
        # every line, and a user's reward on the first examples, before any work
        return check_task(train, dataset) or task_for(train, dataset)
    except (FileNotFoundError, DatasetError, TaskLoadError) as e:
        raise EvalInputError(str(e)) from None


def _load_policy(path: Path, device: torch.device, dtype: str) -> Policy:
    if not path.exists():
        raise EvalInputError(f"checkpoint {path} does not exist (an rlpipe .pt file or a HuggingFace directory)")
    try:
        policy = load_policy(path, device=device, dtype=dtype)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        raise EvalInputError(f"checkpoint {path} does not load: {type(e).__name__}: {e}") from None
    policy.model.eval()
    return policy


def _context_length(model) -> int | None:
    config = getattr(getattr(model, "_orig_mod", model), "config", None)
    return getattr(config, "context_length", None) or getattr(config, "max_position_embeddings", None)


def encode_prompts(policy: Policy, examples: list[Example], max_tokens: int) -> list[list[int]]:
    """Token ids of every prompt; refuses (naming the checkpoint) a prompt that cannot fit."""
    ids = policy.tokenizer.encode_batch([e.prompt for e in examples])
    context = _context_length(policy.model)
    longest = max(len(p) for p in ids)
    if context is not None and longest + max_tokens - 1 > context:
        worst = max(range(len(ids)), key=lambda i: len(ids[i]))
        raise EvalInputError(f"example {worst}'s prompt ({longest} tokens) + max tokens ({max_tokens}) - 1 exceeds "
                             f"the context length {context} of {policy.source}; lower --max-tokens")
    return ids


def load_inputs(cfg: PipelineConfig, req: EvalRequest) -> Inputs:
    """Check and load everything (see the module doc) before any generation."""
    train = math_train_config(cfg)
    task = _load_task(train, Path(req.dataset))
    examples = task.val_examples()[: req.n or cfg.math.eval_size]
    params = sampling_params(cfg, train, task, req)
    setup_process(req.threads or train.threads, params.seed)
    device = resolve_device(req.device or train.device)
    policy = _load_policy(Path(req.checkpoint), device, train.dtype)
    prompt_ids = encode_prompts(policy, examples, params.max_tokens)
    return Inputs(train, task, examples, params, policy, device, prompt_ids)


# ----------------------------------------------------------------------------- generate and grade


def sample_responses(inp: Inputs, chunk: int | None = None) -> tuple[list[str], list[str], int]:
    """(response texts, finish reasons, tokens generated): one sample per prompt, in chunks, each
    through the run's decode (``train.decode``: on a GPU, the HF engine of ``rlpipe.lm.hf_decode``)."""
    from tqdm import tqdm

    chunk = chunk or (CUDA_CHUNK if inp.device.type == "cuda" else CHUNK)
    texts: list[str] = []
    reasons: list[str] = []
    tokens = 0
    bar = tqdm(total=len(inp.prompt_ids), desc="eval", unit="example", mininterval=2.0, file=sys.stderr)
    with torch.inference_mode(), autocast(inp.device, inp.train.dtype):
        for start in range(0, len(inp.prompt_ids), chunk):
            part = inp.prompt_ids[start:start + chunk]
            out = generate(inp.policy.model, inp.policy.tokenizer, part, inp.params, device=inp.device,
                           decode=inp.train.decode)
            texts += out.response_text
            reasons += out.finish_reason
            tokens += sum(len(r) for r in out.response_ids)
            bar.update(len(part))
    bar.close()
    return texts, reasons, tokens


def category_of(format_reward: float, answer_reward: float) -> str:
    """The ``EVAL_CATEGORIES`` key of a (format, answer) reward pair (a reward >= 0.5 counts as 1)."""
    key = (int(float(format_reward) >= 0.5), int(float(answer_reward) >= 0.5))
    return next(name for name, pair in EVAL_CATEGORIES.items() if pair == key)


def _truth_text(ground_truth: Any) -> str:
    return ground_truth if isinstance(ground_truth, str) else json.dumps(ground_truth)


def score_examples(task: Task, examples: list[Example], responses: list[str],
                   finish_reasons: list[str]) -> tuple[pd.DataFrame, int]:
    """(the examples.parquet frame, number of failed gradings): grades every response with the
    task's reward, a failing grader scoring 0."""
    scores, failures = guarded_rewards(task.reward, responses, [e.ground_truth for e in examples])
    rows = []
    for i, (ex, resp, reason, s) in enumerate(zip(examples, responses, finish_reasons, scores, strict=True)):
        fmt, ans = float(s.get("format_reward", 0.0)), float(s.get("answer_reward", 0.0))
        rows.append((i, ex.prompt, resp, _truth_text(ex.ground_truth), fmt, ans, float(s["reward"]),
                     category_of(fmt, ans), reason))
    frame = pd.DataFrame(rows, columns=list(EVAL_COLUMNS))
    dtypes = {c: "int64" for c in EVAL_INT_COLUMNS} | {c: "float64" for c in EVAL_FLOAT_COLUMNS}
    return frame.astype(dtypes), failures


def summarize(frame: pd.DataFrame, **meta: Any) -> dict[str, Any]:
    """summary.json: the rates and category counts of ``frame`` plus ``meta`` (the other
    ``EVAL_SUMMARY_KEYS``)."""
    n = len(frame)
    counts = frame["category"].value_counts()
    means = {c: float(frame[c].mean()) if n else 0.0 for c in ("answer_reward", "format_reward", "reward")}
    summary = {"n": n, "accuracy": means["answer_reward"], "format_rate": means["format_reward"],
               "reward_mean": means["reward"], "categories": {c: int(counts.get(c, 0)) for c in EVAL_CATEGORIES},
               **meta}
    if set(summary) != set(EVAL_SUMMARY_KEYS):
        raise ValueError(f"eval summary keys {sorted(summary)} differ from EVAL_SUMMARY_KEYS {EVAL_SUMMARY_KEYS}")
    return {k: summary[k] for k in EVAL_SUMMARY_KEYS}


def evaluate(cfg: PipelineConfig, req: EvalRequest, out_dir: str | Path) -> dict[str, Any]:
    """Seed 001's ``evaluate_vllm``: generate, grade, write ``EVAL_FILES`` under ``out_dir``;
    returns the summary."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise EvalInputError(f"--out {out} exists and is not a directory")
    inp = load_inputs(cfg, req)
    t0 = time.perf_counter()
    responses, reasons, tokens = sample_responses(inp, req.chunk)
    frame, failures = score_examples(inp.task, inp.examples, responses, reasons)
    summary = summarize(
        frame, reward_errors=failures, checkpoint=str(req.checkpoint), dataset=str(req.dataset),
        prompt=getattr(inp.task, "prompt", None), max_tokens=inp.params.max_tokens, temperature=TEMPERATURE,
        top_p=TOP_P, seed=inp.params.seed, wall_time_s=time.perf_counter() - t0, tokens_generated=tokens)
    io.write_parquet(out / EVAL_FILES["examples"], frame)
    io.write_json(out / EVAL_FILES["summary"], summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe eval", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="pipeline config YAML")
    ap.add_argument("--checkpoint", required=True, help="rlpipe checkpoint (.pt) or local HuggingFace directory")
    ap.add_argument("--dataset", required=True, help="MATH-format directory (train.jsonl + validation.jsonl)")
    ap.add_argument("--out", required=True, help="output directory (examples.parquet, summary.json)")
    ap.add_argument("--n", type=int, default=None, help="validation examples (default math.eval_size)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="max new tokens (default math.eval_max_tokens or train.sampling_max_tokens)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default train.threads)")
    ap.add_argument("--device", default=None, help="cpu | cuda | cuda:N | auto (default train.device)")
    ap.add_argument("--seed", type=int, default=None, help="sampling seed (default train.val_seed)")
    a = ap.parse_args(argv)
    for flag, value in (("--n", a.n), ("--max-tokens", a.max_tokens), ("--threads", a.threads)):
        if value is not None and value < 1:
            ap.error(f"{flag} must be >= 1, got {value}")
    req = EvalRequest(a.checkpoint, a.dataset, a.n, a.max_tokens, a.seed, a.device, a.threads)
    try:
        s = evaluate(load_config(a.config), req, a.out)
    except (ConfigError, EvalInputError, FileNotFoundError) as e:
        ap.error(str(e))  # bad input: exit status 2, nothing generated
    except io.OutputWriteError as e:
        print(f"rlpipe eval: error: {e}", file=sys.stderr)
        return 1
    cats = ", ".join(f"{k} {v}" for k, v in s["categories"].items())
    print(f"eval: accuracy {s['accuracy']:.3f}, format rate {s['format_rate']:.3f} on {s['n']} examples "
          f"({cats}) -> {a.out}")
    return 0
