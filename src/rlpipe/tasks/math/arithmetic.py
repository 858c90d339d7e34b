"""The embedded CPU-learnable math task: seeded multi-step integer arithmetic in MATH format.

A problem is a chain of 1-3 additions and subtractions of small integers (``Problem``, drawn by
``draw_problem``) with an ``r1_zero`` worked solution (``worked_response``). ``build_math_data``
(``rlpipe build-math-data``) writes the MATH-format splits and the pretraining corpus
(``iter_corpus``: full documents and short drills, ``corpus_document``), whose solution steps carry
deliberate slips for GRPO to unlearn (``draw_slips``: why, and what it measured). Why the task is
learnable on a CPU: ``Problem``.

How it departs from seeds 001/004 (MATH + Qwen 2.5 Math 1.5B) and why: the seeds post-train a
GPU-sized pretrained math model on competition problems; on a 2-core CPU no such model can run, and
our own tiny model pretrained for minutes cannot solve a single MATH problem (reward 0: nothing for
GRPO to reinforce). The arithmetic task keeps everything else of the math track unchanged: the
MATH file format, the r1_zero prompt and stop string, the r1_zero grader, and the train/eval code.
The corpus's deliberate slips are a departure from the seeds' data (``draw_slips``).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rlpipe.config import ArithmeticConfig, load_config
from rlpipe.io import atomic_path, write_jsonl
from rlpipe.lm.documents import DOC_SEPARATOR
from rlpipe.tasks.math.prompt import format_math_prompt

PROMPT = "r1_zero"


@dataclass(frozen=True)
class Problem:
    """A chain ``first ops[0][0] ops[0][1] ops[1][0] ...`` evaluated left to right, e.g.
    ``"Compute 7 + 12 - 5."`` (ground truth ``"14"``). Operands lie in ``1..max_operand`` and every
    intermediate result in ``0..max_value`` (subtractions never go negative, sums never exceed
    ``max_value``), so the whole task lives on a few hundred number tokens.

    Why it is learnable on a CPU. The ``cpu-tiny`` model (0.96M parameters at the BPE's 451 tokens)
    pretrained for a few minutes learns the r1_zero format perfectly (every document has it) and
    small addition and subtraction facts fairly well: with ``tokenizer.vocab_size`` 512 the
    byte-level BPE runs out of merges at 451 tokens and keeps every number up to ~60 as one token
    (``" 17"``), so each step is one lookup ``a op b`` over a few hundred facts, and the
    chain-of-steps solution turns a 3-operation problem into three such lookups plus copies.
    Responses are 15-30 tokens and prompts ~100, so a GRPO step of 32 rollouts takes ~1.5 s on one
    thread."""

    first: int
    ops: tuple[tuple[str, int], ...]  # (operator "+" or "-", operand)

    @property
    def text(self) -> str:
        chain = " ".join([str(self.first)] + [f"{op} {b}" for op, b in self.ops])
        return f"Compute {chain}."

    @property
    def answer(self) -> int:
        return chain_results(self)[-1][3] if self.ops else self.first


def apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b


FLIP = {"+": "-", "-": "+"}


def chain_results(p: Problem, flips: tuple[bool, ...] | None = None) -> list[tuple[int, str, int, int]]:
    """Every step as (left, written operator, operand, result). ``flips[i]`` (corpus slips only)
    writes step i with the other operator; the step is still computed right and the later steps
    carry its result on, so only the final answer is wrong."""
    value, out = p.first, []
    for i, (op, b) in enumerate(p.ops):
        written = FLIP[op] if flips and flips[i] else op
        out.append((value, written, b, apply(written, value, b)))
        value = out[-1][3]
    return out


def draw_problem(cfg: ArithmeticConfig, rng: random.Random) -> Problem:
    """One problem: ``min_ops..max_ops`` operations, every intermediate result in 0..max_value.
    The operator is drawn among those that have room (a sum below max_value, a difference >= 0)."""
    first = value = rng.randint(1, cfg.max_operand)
    ops = []
    for _ in range(rng.randint(cfg.min_ops, cfg.max_ops)):
        room_up, room_down = min(cfg.max_operand, cfg.max_value - value), min(cfg.max_operand, value)
        op = rng.choice("+-") if room_up >= 1 and room_down >= 1 else ("+" if room_up >= 1 else "-")
        b = rng.randint(1, room_up if op == "+" else room_down)
        ops.append((op, b))
        value = apply(op, value, b)
    return Problem(first, tuple(ops))


def worked_response(p: Problem, flips: tuple[bool, ...] | None = None) -> str:
    """The r1_zero continuation after ``"Assistant: <think>"``: one ``a op b = c.`` per step, then
    the last result as the answer. ``flips`` (corpus slips only) miscopy some operators. E.g.::

         7 + 12 = 19. 19 - 5 = 14. </think> <answer> 14 </answer>

    which ``rlpipe.tasks.math.reward.r1_zero_reward_fn`` grades 1 (it needs ``"</think> <answer>"``
    with one space and a later ``"</answer>"``; the answer between them is stripped by
    math-verify)."""
    steps = chain_results(p, flips)
    text = " ".join(f"{a} {op} {b} = {r}." for a, op, b, r in steps)
    return f" {text} </think> <answer> {steps[-1][3]} </answer>"


def math_solution(p: Problem) -> str:
    """The MATH-style ``solution`` field: the correct steps, the answer in a final ``\\boxed{}``."""
    steps = worked_response(p).split(" </think>")[0].strip()
    return f"{steps} The answer is $\\boxed{{{p.answer}}}$."


def draw_slips(cfg: ArithmeticConfig, p: Problem, rng: random.Random) -> tuple[bool, ...]:
    """Per step, with probability ``slip_rate``: miscopy its operator, unless that would take a
    result of the written chain out of 0..max_value (then the step is copied right).

    The deliberate slips, a departure from the data of the seeds. A miscopied step
    (``12 + 5 = 17.`` for ``12 - 5``) is computed right and the later steps carry its result on, so
    the final answer is wrong (the problem is never changed). A base model pretrained on that
    corpus reproduces the slips at temperature 1.0: its zero-shot accuracy is about its own
    arithmetic competence times ``(1 - slip) ** steps``, which makes the starting point adjustable
    without changing model size or pretraining time, and gives GRPO a real, learnable fix: a slip
    is one discrete choice at one kind of position (copy the operator or not), the same in every
    problem, so rewarding slip-free chains generalises across problems. Measured alternative: with
    step results off by 1-2 instead (a blurred adder rather than a discrete mistake) GRPO did not
    raise validation reward in 50 steps (lr 5e-5; at 2e-4 it fell), since the fix is then per
    arithmetic fact. Without slips the base accuracy would be set only by how far pretraining got.
    Every written step is a true fact, so slips never teach wrong arithmetic. Measured in the
    default pipeline (560 pretraining steps of 128 tokens, 2026-11-23, shared 2-core CPU):
    zero-shot answer reward 0.48 (format 1.0, 512 val problems, temperature 1); 48 on-policy GRPO
    steps of 32 samples (84 s) raise it to 0.76. (An earlier measurement, on a model pretrained
    450 steps of 144 tokens: 0.43, and 0.74 after 150 steps, 0.90 / 0.76 / 0.59 on 1 / 2 /
    3-operation problems.) Multi-step problems slip more often, so the task has graded
    difficulty, and the ceiling is the model's arithmetic competence, so the reward does not
    saturate at 1 within the default run."""
    flips: list[bool] = []
    for i in range(len(p.ops)):
        tried = tuple(flips) + (True,) + (False,) * (len(p.ops) - i - 1)
        ok = all(0 <= r <= cfg.max_value for *_, r in chain_results(p, tried))
        flips.append(ok and rng.random() < cfg.slip_rate)
    return tuple(flips)


def corpus_document(p: Problem, slips: tuple[bool, ...], drill: bool = False) -> str:
    """The r1_zero prompt and the worked solution; a drill keeps only the prompt's ``User:`` and
    ``Assistant: <think>`` lines (same tokens from ``User`` on, a fifth of the length).

    A *full* document is exactly what GRPO will sample from. A *drill* (``drill_fraction`` of the
    corpus) exists because the r1_zero preamble is ~85 of a full document's ~120 tokens and
    carries nothing to learn after the first few hundred steps; a drill is ~40 tokens, so the same
    pretraining budget shows the model several times more arithmetic steps. The drill's tokens
    from ``User`` on are the full document's (byte-level BPE splits ``>`` from the next word), so
    what a drill teaches transfers to the full prompt, and the full documents keep the preamble
    itself in-distribution."""
    prompt = format_math_prompt(PROMPT, p.text)
    if drill:
        prompt = prompt[prompt.rindex("\nUser: ") + 1:]
    return prompt + worked_response(p, slips)


def unique_problems(cfg: ArithmeticConfig, count: int, stream: str, exclude: set[str]) -> list[Problem]:
    """``count`` distinct problems not in ``exclude`` (by text), from the named seeded stream.
    Each split has its own stream, so e.g. ``corpus_documents`` never changes the val problems."""
    rng = random.Random(f"rlpipe-arithmetic-{cfg.seed}-{stream}")
    seen, out = set(exclude), []
    for _ in range(count * 200):  # bounded: a too-small problem space fails below, not forever
        p = draw_problem(cfg, rng)
        if p.text not in seen:
            seen.add(p.text)
            out.append(p)
            if len(out) == count:
                return out
    raise ValueError(f"math.arithmetic: only {len(out)} distinct {stream} problems exist for these settings "
                     f"(asked for {count}); raise max_operand/max_ops or lower num_train/num_val")


def iter_corpus(cfg: ArithmeticConfig, exclude: set[str]) -> Iterator[str]:
    """``corpus_documents`` documents of fresh problems (repeats allowed, ``exclude`` never)."""
    rng = random.Random(f"rlpipe-arithmetic-{cfg.seed}-corpus")
    made = 0
    for _ in range(cfg.corpus_documents * 200):
        p = draw_problem(cfg, rng)
        if p.text in exclude:
            continue
        slips = draw_slips(cfg, p, rng)
        yield corpus_document(p, slips, drill=rng.random() < cfg.drill_fraction)
        made += 1
        if made == cfg.corpus_documents:
            return
    raise ValueError("math.arithmetic: the validation problems cover the whole problem space; "
                     "raise max_operand/max_ops or lower num_val")


def record(p: Problem) -> dict:
    return {"problem": p.text, "answer": str(p.answer), "solution": math_solution(p)}


@dataclass
class MathDataStats:
    train: int
    val: int
    documents: int
    characters: int


def build_math_data(cfg: ArithmeticConfig, out_dir: str | Path) -> MathDataStats:
    """Write ``train.jsonl``, ``val.jsonl`` and ``corpus.txt`` to ``out_dir``, each atomically.

    The splits have MATH's fields ``problem``, ``answer``, ``solution`` (the solution ends
    ``$\\boxed{14}$`` like MATH's); the corpus has ``corpus_documents`` documents, each a problem
    followed by its worked solution, separated as ``rlpipe.lm.documents`` reads them. Validation
    problems never occur in the corpus or in ``train.jsonl`` (dedupe by problem text); training
    problems may occur in the corpus."""
    out = Path(out_dir)
    val = unique_problems(cfg, cfg.num_val, "val", set())
    val_texts = {p.text for p in val}
    train = unique_problems(cfg, cfg.num_train, "train", val_texts)
    write_jsonl(out / "train.jsonl", [record(p) for p in train])
    write_jsonl(out / "val.jsonl", [record(p) for p in val])
    n_docs = n_chars = 0
    with atomic_path(out / "corpus.txt") as tmp, open(tmp, "w", encoding="utf-8") as f:
        for doc in iter_corpus(cfg, val_texts):
            f.write(doc + DOC_SEPARATOR)
            n_docs += 1
            n_chars += len(doc) + len(DOC_SEPARATOR)
    return MathDataStats(len(train), len(val), n_docs, n_chars)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe build-math-data", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="pipeline config YAML (reads math.arithmetic)")
    ap.add_argument("--out", required=True, help="directory for train.jsonl, val.jsonl and corpus.txt")
    args = ap.parse_args(argv)
    cfg = load_config(args.config).math.arithmetic
    s = build_math_data(cfg, args.out)
    print(f"build-math-data: {s.train} train and {s.val} val problems, {s.documents} corpus documents "
          f"({s.characters / 1e6:.1f}M chars) -> {args.out}")
    return 0
