"""Zero-shot evaluation of a base model on the keyword task (``rlpipe eval-base``).

``zero_shot_reward`` measures a checkpoint exactly as the trainer's validation does (one sample per
validation prompt, ``rlpipe.lm.sampler.generate``, ``keyword_inclusion_reward_fn``). The workflow's
``evaluate_base`` rule runs it on 256 validation prompts after pretraining and warns when the
reward is outside ``LEARNABLE_BAND``: this is how the default corpus mix
(``data.keyword_prompt_fraction``, ``data.keyword_hit_rate``) was tuned to give GRPO an imperfect
but learnable starting point (0.33 with the defaults).

Departure from the last layout: this used to be ``rlpipe pretrain --eval-reward``; it moved into the
keyword task's folder so that ``lm/`` knows nothing of any task.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from rlpipe.config import eval_base_settings, load_config
from rlpipe.io import write_json
from rlpipe.lm.checkpoint import load_checkpoint
from rlpipe.lm.sampler import SamplingParams, generate
from rlpipe.lm.tokenizer import load_tokenizer
from rlpipe.tasks.keyword.dataset import load_split
from rlpipe.tasks.keyword.reward import keyword_inclusion_reward_fn

# Zero-shot keyword rewards inside this band leave GRPO something to reinforce and room to improve.
LEARNABLE_BAND = (0.05, 0.6)


@dataclass
class ZeroShotReward:
    mean: float
    n: int
    rewards: list[float]
    prompts: list[str]
    responses: list[str]


def zero_shot_reward(checkpoint: str | Path, dataset_dir: str | Path, n: int | None = None,
                     temperature: float = 0.8, max_tokens: int = 60, seed: int = 1234,
                     batch_size: int = 128, device: str = "cpu") -> ZeroShotReward:
    """Keyword-inclusion reward of a checkpoint on the first ``n`` validation prompts (all when
    ``None``): one sample each, as the trainer's validation does."""

    examples = load_split(dataset_dir, "val")[:n]
    ckpt = load_checkpoint(checkpoint, device=device)
    if ckpt.tokenizer is None:
        raise ValueError(f"checkpoint {checkpoint} has no tokenizer reference")
    tokenizer = load_tokenizer(ckpt.tokenizer)
    params = SamplingParams(n=1, temperature=temperature, max_tokens=max_tokens, seed=seed)
    responses: list[str] = []
    # progress in the rule's log (stderr), one update per chunk
    bar = tqdm(total=len(examples), desc="eval-base", unit="prompt", mininterval=2.0, file=sys.stderr)
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        responses += generate(ckpt.model, tokenizer, [e.prompt for e in chunk], params, device=device).response_text
        bar.update(len(chunk))
    bar.close()
    rewards = [float(keyword_inclusion_reward_fn(r, e.keywords)["reward"])
               for r, e in zip(responses, examples, strict=True)]
    mean = sum(rewards) / max(1, len(rewards))
    return ZeroShotReward(mean, len(rewards), rewards, [e.prompt for e in examples], responses)


def evaluate_base(cfg, checkpoint: str | Path, dataset: str | Path, n: int | None) -> dict:
    """Zero-shot reward with the trainer's sampling settings, plus a warning outside the band."""
    t = eval_base_settings(cfg)  # only these train settings (the workflow reruns it when they change)
    res = zero_shot_reward(checkpoint, dataset, n, t["sampling_temperature"], t["sampling_max_tokens"], t["val_seed"])
    print(f"eval-base: zero-shot keyword reward {res.mean:.3f} on {res.n} validation prompts "
          f"(temperature {t['sampling_temperature']}, max_tokens {t['sampling_max_tokens']})")
    lo, hi = LEARNABLE_BAND
    if not lo <= res.mean <= hi:
        why = "nothing for GRPO to reinforce" if res.mean < lo else "little headroom for GRPO"
        print(f"eval-base: WARNING: the zero-shot reward {res.mean:.3f} is outside [{lo}, {hi}] ({why}); "
              "change pretrain.max_steps or data.keyword_hit_rate")
    examples = [{"prompt": p, "response": r, "reward": x}
                for p, r, x in list(zip(res.prompts, res.responses, res.rewards, strict=True))[:8]]
    return {"reward/mean": res.mean, "n": res.n, "temperature": t["sampling_temperature"],
            "max_tokens": t["sampling_max_tokens"], "learnable_band": list(LEARNABLE_BAND), "examples": examples}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe eval-base", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--checkpoint", required=True, help="base model (rlpipe pretrain / import-base)")
    ap.add_argument("--dataset", required=True, help="keyword dataset directory (val.jsonl)")
    ap.add_argument("--n", type=int, default=None, help="validation prompts (default all)")
    ap.add_argument("--out", required=True, help="JSON to write")
    args = ap.parse_args(argv)
    for path in (Path(args.checkpoint), Path(args.dataset) / "val.jsonl"):
        if not path.is_file():
            ap.error(f"{path} not found")
    write_json(args.out, evaluate_base(load_config(args.config), args.checkpoint, args.dataset, args.n))
    return 0
