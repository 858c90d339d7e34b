"""Data of the word-list reversal example: ``train.jsonl``, ``val.jsonl`` and a pretraining corpus.

The task. A prompt lists 3-5 distinct short lowercase words; the answer is the same words in reverse
order, followed by a full stop::

    Reverse lamp fish gold road: road gold fish lamp.

(the prompt, ``template.txt``, is everything up to the colon; the response, what the model writes,
is `` road gold fish lamp.``). Each JSONL line holds ``words`` (the prompt's words, space-separated)
and ``answer`` (the reversed words, space-separated, without the stop). The prompt is terse on
purpose: every token of it is compute for a CPU-sized model, and the model learns the task from the
corpus, not from the instruction.

The corpus. ``corpus.txt`` holds worked examples in exactly the prompt + response format, separated
as rlpipe's pretraining reads them (``\\n<|endoftext|>\\n``). Two departures from plain worked
examples set up what GRPO then learns:

- Slips: a fraction ``--slip`` of the 3-5 word documents have a wrong answer (two neighbouring
  words swapped, one word dropped, or the words in their original order). A model pretrained on
  them reproduces the slips when sampled at temperature 1, so its starting reward is about
  ``1 - slip`` times what it has learnt of the task, and GRPO has something to fix: each slip is a
  discrete choice at one position, rewarded 0 on every prompt, so what GRPO learns on training
  prompts carries over to held-out ones. rlpipe's built-in arithmetic task sets its starting point
  the same way.
- Drills: a fraction ``--drills`` of the documents reverse only 1 or 2 words (always correctly).
  Reversal needs the model to find the previous answer word in the prompt and copy the word before
  it; short lists teach exactly that step with little else around it, so a tiny model picks the
  skill up in fewer pretraining steps. No prompt or validation list is that short.

Validation word lists never occur in the corpus or in ``train.jsonl``. Standard library only,
deterministic in ``--seed``; every file is written to a temporary name and renamed, so an
interrupted run never leaves a half-written file behind.

    python examples/wordrev/make_data.py --out data/wordrev [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

# A few hundred short, common, lowercase words (3-5 letters), written for this example.
WORDS = sorted(set("""
ant ape arm art ash axe bag bar bat bay bed bee bell belt bike bird boat bone book boot bowl box
boy bread brick bud bug bus cake calf camp cap car card cart cat cave chair chalk cheek chin city
clay cliff cloak cloud coal coat cod coin cold comb cook cord corn cow crab crow cub cup dam deer
desk dew dish dock dog doll door dove drum duck dust eagle ear earth egg elk elm fan farm fern
field fig fire fish flag flute fog foot fork fox frog fruit gate gem ghost gift girl glass glove
goat gold goose grape grass gull gum hair hall ham hand hat hawk hay hen hill hive hog hook horn
horse hut ice ink iron isle jam jar jaw jet jug kelp key kid king kite knee knife lake lamb lamp
leaf leg lemon lid lily lime lion lip lock log loom lung map mask mat meal milk mill mint mole
moon moss moth mouse mud mule nail neck nest net nose nut oak oar oat owl ox pail pan park paw pea
pear pen pig pin pine pipe plum pod pond pot pupil quilt rag rain rake rat reed ribs ring road
rock roof room root rope rose rug salt sand seal seed shed sheep shell ship shoe silk sink sky
sled slug snail snow soap sock sofa soup spoon star stem stone stool straw sun swan table tail
tank tea tent tide tiger toad toe tool tooth torch tower toy tray tree tub tulip twig van vase
vine wall wand wasp wave web well whale wheat wheel wind wing wolf wool worm yak yard yarn zoo
""".split()))

PROMPT = "Reverse {words}:"  # the text of template.txt
STOP = "."
DOC_SEPARATOR = "\n<|endoftext|>\n"  # rlpipe.lm.documents' corpus format
MIN_WORDS, MAX_WORDS = 3, 5
# Words in use by default. The model must learn, per word, to copy it; the fewer the words, the
# sooner that skill appears in pretraining. With the whole list the tiny model of run.yaml had not
# learnt it within the pretraining budget; with 48 words it has, at a step that varies by seed.
VOCAB = 48


def vocabulary(size: int | None) -> list[str]:
    """The first ``size`` words of a fixed shuffle of ``WORDS`` (all of them for None)."""
    words = list(WORDS)
    random.Random("wordrev-vocabulary").shuffle(words)
    return sorted(words[:size])


def draw_words(rng: random.Random, words: list[str]) -> tuple[str, ...]:
    """3-5 distinct words (distinct, so that the reversed order is unambiguous to grade)."""
    return tuple(rng.sample(words, rng.randint(MIN_WORDS, MAX_WORDS)))


def slipped(words: tuple[str, ...], rng: random.Random) -> list[str]:
    """A wrong answer: the reversed list with two neighbours swapped, one word dropped, or the
    original (forward) order. Never the right answer (the words are distinct)."""
    rev = list(reversed(words))
    kind = rng.choice(("swap", "drop", "forward"))
    if kind == "swap":
        i = rng.randrange(len(rev) - 1)
        rev[i], rev[i + 1] = rev[i + 1], rev[i]
        return rev
    if kind == "drop":
        del rev[rng.randrange(len(rev))]
        return rev
    return list(words)


def document(words: tuple[str, ...], answer: list[str]) -> str:
    """A corpus document: the prompt, then the response exactly as the model should write it."""
    return PROMPT.format(words=" ".join(words)) + " " + " ".join(answer) + STOP


def unique_lists(rng: random.Random, words: list[str], count: int,
                 exclude: set[tuple[str, ...]]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    seen = set(exclude)
    while len(out) < count:  # the space holds billions of lists: this ends
        w = draw_words(rng, words)
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def jsonl(lists: list[tuple[str, ...]]) -> str:
    rows = ({"words": " ".join(w), "answer": " ".join(reversed(w))} for w in lists)
    return "".join(json.dumps(r) + "\n" for r in rows)


def build(out: Path, seed: int, n_train: int, n_val: int, n_corpus: int, slip: float,
          drills: float = 0.5, vocab: int | None = VOCAB) -> dict[str, int]:
    """Write the three files to ``out``; return their sizes. Each split has its own seeded stream."""
    out.mkdir(parents=True, exist_ok=True)
    words = vocabulary(vocab)
    val = unique_lists(random.Random(f"wordrev-{seed}-val"), words, n_val, set())
    val_set = set(val)
    train = unique_lists(random.Random(f"wordrev-{seed}-train"), words, n_train, val_set)
    rng = random.Random(f"wordrev-{seed}-corpus")
    docs, wrong = [], 0
    while len(docs) < n_corpus:
        if rng.random() < drills:
            w = tuple(rng.sample(words, rng.randint(1, MIN_WORDS - 1)))
            docs.append(document(w, list(reversed(w))))
            continue
        w = draw_words(rng, words)
        if w in val_set:
            continue
        bad = rng.random() < slip
        wrong += bad
        docs.append(document(w, slipped(w, rng) if bad else list(reversed(w))))
    write_atomic(out / "train.jsonl", jsonl(train))
    write_atomic(out / "val.jsonl", jsonl(val))
    write_atomic(out / "corpus.txt", "".join(d + DOC_SEPARATOR for d in docs))
    return {"train": len(train), "val": len(val), "documents": len(docs), "wrong": wrong}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for train.jsonl, val.jsonl and corpus.txt")
    ap.add_argument("--seed", type=int, default=0, help="seed of every split (default 0)")
    ap.add_argument("--train", type=int, default=4000, help="training word lists (GRPO prompts)")
    ap.add_argument("--val", type=int, default=512, help="held-out validation word lists")
    ap.add_argument("--corpus", type=int, default=60000, help="pretraining documents")
    ap.add_argument("--slip", type=float, default=0.35, help="fraction of corpus answers that are wrong")
    ap.add_argument("--vocab", type=int, default=VOCAB, help=f"words of the list in use (default {VOCAB})")
    ap.add_argument("--drills", type=float, default=0.5, help="fraction of corpus documents that are 1-2 word drills")
    args = ap.parse_args(argv)
    for name in ("train", "val", "corpus"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("slip", "drills"):
        if not 0 <= getattr(args, name) < 1:
            ap.error(f"--{name} must lie in [0, 1), got {getattr(args, name)}")
    if not MAX_WORDS <= args.vocab <= len(WORDS):
        ap.error(f"--vocab must lie in [{MAX_WORDS}, {len(WORDS)}], got {args.vocab}")
    s = build(Path(args.out), args.seed, args.train, args.val, args.corpus, args.slip, args.drills, args.vocab)
    print(f"wordrev: {s['train']} train and {s['val']} val word lists, {s['documents']} corpus documents "
          f"({s['wrong']} with a wrong answer) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
