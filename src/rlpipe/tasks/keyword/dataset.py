"""Keyword-inclusion dataset (seed 000 §3.1 "Task" / "Samples for Training Prompts", seed 001 P16).

Prompts are built from rlpipe's keyword list (``rlpipe/data/keywords.txt``) and its own prompt
templates (``rlpipe/prompts/keyword_templates.txt``, one per line):

- ``{keywords}`` is replaced by the keywords joined with ``", "`` (``"apple, red"``, as in the seed's
  two-keyword example); ``{s}`` by ``""`` for one keyword and ``"s"`` for several, so one template
  serves both ("the word: apple" / "the words: apple, red").
- **Prompt format** (shared with the pretraining corpus, ``rlpipe.tasks.keyword.corpus``): the formatted template
  followed by exactly one ``"\\n"``. The model's response starts right after that newline, and the
  JSONL ``prompt`` field is this exact string, so the trainer feeds it to the sampler unchanged.

Each prompt asks for ``1..data.max_keywords_per_prompt`` distinct keywords with a uniformly drawn
template; (template, keyword set) pairs are unique, so no prompt is in both splits. The split is a
seeded shuffle with ``round(num_prompts * data.val_fraction)`` prompts in validation (80/20 by
default, seed 001 P16). A keyword that never occurs in a training prompt but does in validation is
listed in ``split.json`` (``val_only_keywords``): it is a held-out keyword, which the split reports
rather than avoids.

Departure from seed 001 P16: the seed generates reference answers with an off-the-shelf model via
vLLM; rlpipe has no network, so ``answer`` is a story from the corpus generator that contains all
keywords (a reference only: the reward never reads it). Records also carry ``template`` (the
template's index), used by tests and the split report.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from rlpipe.config import ConfigError, PipelineConfig, load_config
from rlpipe.io import write_json, write_jsonl
from rlpipe.tasks.keyword.corpus import StoryGenerator
from rlpipe.tasks.keyword.prompt import format_keyword_prompt, load_templates
from rlpipe.tasks.keyword.reward import MAX_KEYWORD_CHARS
from rlpipe.tasks.keyword.vocabulary import load_keywords

SPLITS = ("train", "val")


@dataclass(frozen=True)
class KeywordExample:
    prompt: str
    keywords: list[str]
    answer: str | None = None
    template: int = -1


def make_examples(cfg: PipelineConfig) -> list[KeywordExample]:
    """``data.num_prompts`` unique (template, keyword set) prompts with reference answers."""
    data = cfg.data
    keywords, templates = load_keywords(data.keywords_path), load_templates()
    if data.max_keywords_per_prompt > len(keywords):
        raise ConfigError(f"data.max_keywords_per_prompt ({data.max_keywords_per_prompt}) exceeds the "
                          f"{len(keywords)} keywords")
    if data.max_keywords_per_prompt == 1 and data.num_prompts > len(keywords) * len(templates):
        raise ConfigError(f"data.num_prompts ({data.num_prompts}) exceeds the {len(keywords)} x "
                          f"{len(templates)} distinct single-keyword prompts")
    rng = random.Random(f"rlpipe-keywords-{data.seed}")
    gen = StoryGenerator(keywords, random.Random(f"rlpipe-answers-{data.seed}"))
    seen: set[tuple[int, frozenset[str]]] = set()
    out: list[KeywordExample] = []
    for _ in range(100 * data.num_prompts):
        if len(out) == data.num_prompts:
            break
        t = rng.randrange(len(templates))
        kws = rng.sample(keywords, rng.randint(1, data.max_keywords_per_prompt))
        if (t, frozenset(kws)) in seen:
            continue
        seen.add((t, frozenset(kws)))
        answer = gen.story(required=kws)
        out.append(KeywordExample(format_keyword_prompt(templates[t], kws), kws, answer, t))
    if len(out) < data.num_prompts:
        raise ConfigError(f"data.num_prompts ({data.num_prompts}): could only draw {len(out)} distinct prompts")
    return out


def split_examples(examples: list[KeywordExample], val_fraction: float, seed: int
                   ) -> tuple[list[KeywordExample], list[KeywordExample]]:
    """Seeded shuffle, then the first ``round(n * val_fraction)`` go to validation."""
    order = list(range(len(examples)))
    random.Random(f"rlpipe-split-{seed}").shuffle(order)
    n_val = round(len(examples) * val_fraction)
    if n_val < 1 or n_val >= len(examples):
        raise ConfigError(f"data.val_fraction={val_fraction} with data.num_prompts={len(examples)} leaves "
                          f"{n_val} validation and {len(examples) - n_val} training prompts; need >= 1 each")
    val = [examples[i] for i in sorted(order[:n_val])]
    train = [examples[i] for i in sorted(order[n_val:])]
    return train, val


def split_report(train: list[KeywordExample], val: list[KeywordExample], cfg: PipelineConfig,
                 n_templates: int) -> dict:
    train_kw = {k for e in train for k in e.keywords}
    val_kw = {k for e in val for k in e.keywords}
    return {
        "seed": cfg.data.seed,
        "num_prompts": len(train) + len(val),
        "counts": {"train": len(train), "val": len(val)},
        "val_fraction": cfg.data.val_fraction,
        "max_keywords_per_prompt": cfg.data.max_keywords_per_prompt,
        "keywords_per_prompt": {str(k): v for k, v in sorted(Counter(len(e.keywords) for e in train + val).items())},
        "template_count": n_templates,
        "templates_used": {"train": sorted({e.template for e in train}), "val": sorted({e.template for e in val})},
        "keywords_total": len(load_keywords(cfg.data.keywords_path)),
        "keywords_in_train": len(train_kw),
        "keywords_in_val": len(val_kw),
        "val_only_keywords": sorted(val_kw - train_kw),
        "prompt_format": "template.format(keywords=', '.join(kws), s='' or 's') + '\\n'; "
                         "the response starts after the newline",
    }


def build_dataset(cfg: PipelineConfig, out_dir: str | Path) -> dict:
    """Write ``train.jsonl``, ``val.jsonl`` and ``split.json`` under ``out_dir`` (atomically each)."""
    examples = make_examples(cfg)
    train, val = split_examples(examples, cfg.data.val_fraction, cfg.data.seed)
    out = Path(out_dir)
    write_jsonl(out / "train.jsonl", [asdict(e) for e in train])
    write_jsonl(out / "val.jsonl", [asdict(e) for e in val])
    report = split_report(train, val, cfg, len(load_templates()))
    write_json(out / "split.json", report)  # last: its presence means the split is complete
    return report


def load_split(dataset_dir: str | Path, split: str) -> list[KeywordExample]:
    """Records of ``<dataset_dir>/<split>.jsonl``; ``split`` is ``train`` or ``val``. Every line is
    checked: JSON, a ``prompt`` string, a non-empty ``keywords`` list of strings; a bad one raises
    ``ValueError`` naming ``file:line`` (the trainer calls this before Ray starts)."""
    split = {"validation": "val"}.get(split, split)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = Path(dataset_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (build it with `rlpipe build-dataset`)")
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                out.append(_record(_json_line(path, i, line), path, i))
    return out


def _json_line(path: Path, lineno: int, line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None


def _record(r, path: Path, i: int) -> KeywordExample:
    if not isinstance(r, dict) or not isinstance(r.get("prompt"), str):
        raise ValueError(f"{path}:{i}: needs a 'prompt' string")
    kws = r.get("keywords")
    if not isinstance(kws, list) or not kws or not all(isinstance(k, str) for k in kws):
        raise ValueError(f"{path}:{i}: needs a non-empty 'keywords' list of strings, got {_short(kws)}")
    long = [k for k in kws if len(k) > MAX_KEYWORD_CHARS]
    if long:
        raise ValueError(f"{path}:{i}: keyword {_short(long[0])} has {len(long[0])} characters; a keyword is a word "
                         f"or a short phrase of at most {MAX_KEYWORD_CHARS}")
    return KeywordExample(r["prompt"], list(kws), r.get("answer"), int(r.get("template", -1)))


def _short(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe build-dataset", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="pipeline config YAML")
    ap.add_argument("--out", required=True, help="output directory (train.jsonl, val.jsonl, split.json)")
    args = ap.parse_args(argv)
    report = build_dataset(load_config(args.config), args.out)
    print(f"build-dataset: {report['counts']['train']} train / {report['counts']['val']} val prompts, "
          f"{len(report['val_only_keywords'])} keywords only in validation -> {args.out}")
    return 0
