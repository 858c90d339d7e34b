"""Pretraining corpus: an offline story generator, a TinyStories reader and the keyword list.

Seed 000 §3.1 post-trains "your own LM" (pretrained on TinyStoriesV2 in HW1) on keyword inclusion,
with keywords "extracted from the TinyStoriesV2 dataset". rlpipe must run without network, so:

- ``data/keywords.txt`` (``vocabulary.py``) is rlpipe's own list of 400+ concrete nouns (animals, foods, toys, objects,
  clothes, places, nature, story characters), one lowercase word per line.
- ``StoryGenerator`` writes short children's stories (3-8 sentences) from templates with
  characters, places, objects, actions and feelings; it is seeded (``random.Random``) and pure
  Python, so the same seed gives the same bytes on every machine.
- ``iter_tinystories`` streams a TinyStoriesV2-style file (``data.corpus_source: tinystories``).

Departure from the seeds, and why: the corpus also contains *prompt-formatted* documents
(``data.keyword_prompt_fraction`` of them): a keyword prompt exactly as the GRPO dataset writes it
(``rlpipe.tasks.keyword.prompt.format_keyword_prompt``: template + ``"\\n"``), then a story. With probability
``data.keyword_hit_rate`` the story contains the keyword(s), always in its first or second
sentence; otherwise it introduces other keywords in the same slot and never the requested one. A
base model pretrained on this mix copies the keyword sometimes but not reliably, which gives GRPO
a non-zero, improvable starting reward. HW1's TinyStories model never saw such prompts, and with
it the reward would start near zero (nothing for RL to reinforce) on a CPU-sized budget.

Two more choices make the copy behaviour appear within a CPU budget (measured: without them a
``cpu-tiny`` model needed 2-3x the steps, with a very seed-dependent onset):

- Generated stories re-mention the objects they introduce ("She took the apple home."), as real
  stories do: in-context copying of a noun is the circuit that copying a prompt keyword reuses.
- ``TITLED_FRACTION`` of the plain documents start with a title line, ``"Title: apple\\n"``, naming
  an object that the story introduces in its first two sentences. Titles always hold, so they
  teach "copy the word before the newline" densely; the keyword prompts' hit rate then only sets
  how often the model uses it after a *keyword prompt* (the only prompt GRPO asks).

Corpus file format: documents separated by ``"\\n<|endoftext|>\\n"`` (TinyStoriesV2 style), so
the same reader serves the generated corpus and the real dataset.
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlpipe.config import ConfigError, DataConfig, PipelineConfig, load_config
from rlpipe.io import atomic_path
from rlpipe.lm.documents import DOC_SEPARATOR, iter_tinystories
from rlpipe.tasks.keyword.prompt import format_keyword_prompt, load_templates
from rlpipe.tasks.keyword.vocabulary import load_keywords, mentions, with_article

# Plain generated stories that introduce an object in their first two sentences (like every
# prompt-formatted story does), so the keyword slot is not a give-away of prompt documents.
PLAIN_KEYWORD_SLOT_P = 0.8
# Plain documents that start with a title line naming an object the story introduces early
# ("Title: apple\n"). Titles always hold: they teach the copy-from-the-line-above circuit densely,
# and the keyword prompts (hit rate ``data.keyword_hit_rate``) only gate how often it is used.
TITLED_FRACTION = 1.0
TITLE_FORMAT = "Title: {keyword}\n"


def split_sentences(story: str) -> list[str]:
    """Split after ``.!?`` (or ``.!?"``) followed by a capital or an opening quote, so that
    ``"Let's play!" said Tim.`` stays one sentence."""
    return [s for s in re.split(r'(?:(?<=[.!?])|(?<=[.!?]"))\s+(?=[A-Z"])', story.strip()) if s]


# --------------------------------------------------------------------------- story generator

_GIRLS = ("Lily", "Mia", "Anna", "Sue", "Lucy", "Emma", "Zoe", "Amy", "Kate", "Sara", "Nina", "Ella")
_BOYS = ("Ben", "Tom", "Sam", "Max", "Tim", "Jack", "Leo", "Finn", "Joe", "Bob", "Dan", "Alex")
_PEOPLE = {"she": ("girl",), "he": ("boy",)}
_ANIMAL_KINDS = ("cat", "dog", "bunny", "bird", "bear", "mouse", "duck", "frog", "puppy", "fox")
_ADJ = ("little", "small", "happy", "kind", "curious", "brave", "shy", "funny", "clever", "friendly")
_PLACES = ("park", "garden", "forest", "beach", "farm", "school", "kitchen", "playground", "pond",
           "hill", "meadow", "zoo", "library", "lake", "yard", "village", "river", "market")
_FOODS = ("apple", "cookie", "cake", "banana", "sandwich", "pie", "muffin", "carrot", "pear", "pancake")
_FEELINGS = ("happy", "sad", "excited", "scared", "proud", "surprised", "tired", "angry", "calm", "glad")
_GOOD_FEELINGS = ("happy", "proud", "glad", "calm", "excited")
_LOOKS = ("big", "pretty", "old", "shiny", "soft", "funny", "new", "small")
_DAYPARTS = ("morning", "day", "evening", "afternoon")
_GAMES = ("tag", "hide and seek", "catch", "a fun game", "pretend")
_ACTIONS = ("ran and jumped", "sang a song", "danced in the sun", "laughed a lot", "looked at the clouds",
            "counted to ten", "built a tall tower", "read a story")
_QUOTES = ("Let's play!", "I am so happy!", "Can you help me?", "Look at this!", "Thank you, friend!",
           "This is fun!", "Do not be sad.", "Let's go together!", "I love this day!")

_OPENINGS = (
    "Once upon a time, there was a {adj} {kind} named {name}.",
    "There once was a {adj} {kind} called {name}.",
    "{name} was a {adj} {kind} who lived near the {place}.",
    "One {daypart}, a {adj} {kind} named {name} went outside.",
)
_OPENINGS_KW = (
    "Once upon a time, there was a {adj} {kind} named {name} who had {a_kw}.",
    "{name} was a {adj} {kind} who loved {a_kw}.",
    "One {daypart}, {name} found {a_kw} near the {place}.",
    "Once upon a time, {name} saw {a_kw} by the {place}.",
)
_KW_SENTENCES = (
    "One day, {subj} saw {a_kw} near the {place}.",
    "{Subj} found {a_kw} in the {place}.",
    "{Subj} drew a picture of {a_kw}.",
    "There was {a_kw} in the {place}, and {subj} ran to see it.",
    "{Subj} wanted {a_kw} more than anything.",
    "{friend} showed {name} {a_kw}.",
    "{Subj} told {friend} about the {kw}.",
    "{Subj} dreamed about {a_kw}.",
)
_MIDDLE = (
    "One day, {subj} went to the {place}.",
    "{Subj} met {friend}, a {adj} {friend_kind}.",
    "{Subj} felt {feeling}.",
    "{Subj} and {friend} played {game} together.",
    "{Subj} ate {a_food} and smiled.",
    "\"{quote}\" said {name}.",
    "{Subj} was {feeling} because {friend} was there.",
    "{Subj} {action} all afternoon.",
    "Then it started to rain, so {subj} ran home.",
    "{friend} was sad, so {name} gave {friend_obj} a hug.",
    "{friend} and {name} shared {a_food}.",
)
# Re-mentions of an object the story already introduced: they teach in-context copying of a noun,
# the circuit that copying a prompt keyword reuses (real TinyStories re-mention objects too).
_REMENTION = (
    "{Subj} took the {kw} home.",
    "The {kw} was very {look}.",
    "{Subj} showed the {kw} to {friend}.",
    "{friend} liked the {kw} too.",
    "{Subj} looked for the {kw} everywhere.",
    "{Subj} played with the {kw} all day.",
    "\"Look at the {kw}!\" said {name}.",
)
_ENDINGS_KW = (
    "In the end, {name} kept the {kw} forever.",
    "{name} smiled at the {kw} and went home.",
)
_ENDINGS = (
    "In the end, {name} was very {good}.",
    "From that day on, {name} and {friend} were best friends.",
    "{name} smiled and went home.",
    "That night, {name} slept well.",
    "{name} learned that it is good to share.",
    "It was the best day ever.",
)


@dataclass
class _Cast:
    name: str
    kind: str
    pron: str
    friend: str
    friend_kind: str
    friend_obj: str
    place: str


class StoryGenerator:
    """Seeded template stories. ``keywords`` are the nouns that generic sentences mention.

    ``story(required=..., avoid=...)``: ``required`` keywords go into the first or second
    sentence (one keyword sentence each, consecutively); ``avoid`` keywords never appear (the
    story is redrawn until they do not; the redraws come from the same seeded stream, so the
    output is still a pure function of the seed).
    """

    # Per middle sentence: re-mention an introduced object / introduce a new one / neither.
    REMENTION_P = 0.6
    NEW_OBJECT_P = 0.1
    ENDING_REMENTION_P = 0.5

    def __init__(self, keywords: Sequence[str], rng: random.Random, min_sentences: int = 3,
                 max_sentences: int = 8):
        if not keywords:
            raise ValueError("StoryGenerator needs at least one keyword")
        self.keywords = list(keywords)
        self.rng = rng
        self.min_sentences, self.max_sentences = min_sentences, max_sentences

    def _cast(self) -> _Cast:
        r = self.rng
        pron = r.choice(("she", "he"))
        if r.random() < 0.6:
            name, kind = r.choice(_GIRLS if pron == "she" else _BOYS), r.choice(_PEOPLE[pron])
        else:
            name, kind = r.choice(_GIRLS + _BOYS), r.choice(_ANIMAL_KINDS)
            pron = "she" if name in _GIRLS else "he"
        fpron = r.choice(("she", "he"))
        friend = r.choice([n for n in (_GIRLS if fpron == "she" else _BOYS) if n != name])
        fkind = r.choice(_PEOPLE[fpron] + _ANIMAL_KINDS)
        return _Cast(name, kind, pron, friend, fkind, "her" if fpron == "she" else "him", r.choice(_PLACES))

    def _fill(self, template: str, cast: _Cast, kw: str | None, first: bool) -> str:
        r = self.rng
        kw = kw or r.choice(self.keywords)
        subj = cast.name if first or r.random() < 0.5 else cast.pron
        food = r.choice(_FOODS)
        return template.format(
            name=cast.name, kind=cast.kind, friend=cast.friend, friend_kind=cast.friend_kind,
            friend_obj=cast.friend_obj, subj=subj, Subj=subj[0].upper() + subj[1:],
            place=cast.place if r.random() < 0.7 else r.choice(_PLACES), adj=r.choice(_ADJ),
            daypart=r.choice(_DAYPARTS), feeling=r.choice(_FEELINGS), good=r.choice(_GOOD_FEELINGS),
            game=r.choice(_GAMES), action=r.choice(_ACTIONS), quote=r.choice(_QUOTES),
            a_food=with_article(food), kw=kw, a_kw=with_article(kw), look=r.choice(_LOOKS),
        )

    def _draw(self, required: Sequence[str], keyword_slot: bool) -> str:
        """One story. ``keyword_slot``: put a keyword sentence in the first or second sentence
        (with ``required`` keywords, or random ones), so hit and miss stories share one shape.
        Later sentences re-mention introduced objects, introduce new ones, or neither."""
        r = self.rng
        cast = self._cast()
        # min of two uniform draws: most stories are short (3-5 sentences), so a token budget
        # holds more story openings, where keywords are introduced.
        n = min(r.randint(self.min_sentences, self.max_sentences), r.randint(self.min_sentences, self.max_sentences))
        objects = list(required) or ([r.choice(self.keywords)] if keyword_slot else [])
        in_opening = bool(objects) and r.random() < 0.5
        sentences = [self._fill(r.choice(_OPENINGS_KW if in_opening else _OPENINGS), cast,
                                objects[0] if in_opening else None, True)]
        rest = objects[1:] if in_opening else objects
        sentences += [self._fill(r.choice(_KW_SENTENCES), cast, kw, False) for kw in rest]
        while len(sentences) < n - 1:
            u = r.random()
            if objects and u < self.REMENTION_P:
                sentences.append(self._fill(r.choice(_REMENTION), cast, r.choice(objects), False))
            elif u < self.REMENTION_P + self.NEW_OBJECT_P:
                objects.append(r.choice(self.keywords))
                sentences.append(self._fill(r.choice(_KW_SENTENCES), cast, objects[-1], False))
            else:
                sentences.append(self._fill(r.choice(_MIDDLE), cast, None, False))
        if objects and r.random() < self.ENDING_REMENTION_P:
            sentences.append(self._fill(r.choice(_ENDINGS_KW), cast, r.choice(objects), False))
        else:
            sentences.append(self._fill(r.choice(_ENDINGS), cast, None, False))
        return " ".join(sentences)

    def story(self, required: Sequence[str] = (), avoid: Sequence[str] = (), keyword_slot: bool = False,
              max_tries: int = 100) -> str:
        for _ in range(max_tries):
            text = self._draw(required, keyword_slot)
            if not any(mentions(text, w) for w in avoid):
                return text
        raise RuntimeError(f"could not write a story avoiding {list(avoid)} in {max_tries} tries")


# --------------------------------------------------------------------------- corpus mixing


def check_corpus_source(data: DataConfig) -> None:
    """A TinyStories source file must exist before any work (ranges are the config's job)."""
    if data.corpus_source == "tinystories" and not Path(data.corpus_path or "").is_file():
        raise ConfigError(f"data.corpus_path: file not found: {data.corpus_path}")


_INSERTED = (  # name-free, because a real story's characters are unknown
    "There was {a_kw} nearby.",
    "That day, they saw {a_kw}.",
    "Everyone looked at the {kw}.",
)


def _tinystories_hit(story: str, keywords: list[str], rng: random.Random) -> str:
    """Make a real story a hit: a keyword missing from its first two sentences gets a short
    sentence of its own right after the first sentence."""
    sents = split_sentences(story)
    inserted = [rng.choice(_INSERTED).format(kw=kw, a_kw=with_article(kw)) for kw in keywords
                if not any(mentions(s, kw) for s in sents[:2])]
    return " ".join(sents[:1] + inserted + sents[1:])


def _present(text: str, keywords: Sequence[str]) -> set[str]:
    """The keywords ``mentions(text, kw)`` holds for. One word split finds the candidates (a word
    equal to the keyword or to one of its regular plurals); only those run the full rule, instead
    of one regex per keyword (a TinyStories story is checked against the whole list)."""
    words = set(re.findall(r"[a-z]+", text.lower()))

    def candidate(w: str) -> bool:
        if not w.isalpha():
            return True
        forms = {w, w + "s", w + "es"} | ({w[:-1] + "ies"} if w.endswith("y") else set())
        return bool(forms & words)

    return {w for w in keywords if candidate(w) and mentions(text, w)}


def _pick_prompt_keywords(story: str | None, k: int, hit: bool, keywords: Sequence[str],
                          rng: random.Random) -> list[str]:
    """For a TinyStories hit, prefer keywords the story already has early; for a miss, only
    keywords the story lacks. For generated stories, any ``k`` keywords."""
    if story is None:
        return rng.sample(keywords, k)
    if hit:
        early = _present(" ".join(split_sentences(story)[:2]), keywords)
        chosen = rng.sample([w for w in keywords if w in early], min(k, len(early)))
        return chosen + rng.sample([w for w in keywords if w not in chosen], k - len(chosen))
    present = _present(story, keywords)
    return rng.sample([w for w in keywords if w not in present], k)


def _plain_document(source: str | None, gen: StoryGenerator, rng: random.Random,
                    keywords: Sequence[str]) -> Document:
    """A story, titled (``TITLED_FRACTION``) with a keyword it mentions in its first two sentences."""
    titled = rng.random() < TITLED_FRACTION
    if source is None:
        if not titled:
            return Document(gen.story(keyword_slot=rng.random() < PLAIN_KEYWORD_SLOT_P))
        kw = rng.choice(keywords)
        return Document(TITLE_FORMAT.format(keyword=kw) + gen.story(required=[kw]), title=kw)
    early = sorted(_present(" ".join(split_sentences(source)[:2]), keywords)) if titled else []
    if not early:
        return Document(source)
    kw = rng.choice(early)
    return Document(TITLE_FORMAT.format(keyword=kw) + source, title=kw)


@dataclass(frozen=True)
class Document:
    """One corpus document. ``keywords`` is empty for a plain story; for a prompt-formatted one,
    ``text = prompt + story`` where ``prompt`` is exactly the GRPO prompt (ends with ``"\\n"``)."""

    text: str
    keywords: tuple[str, ...] = ()
    hit: bool = False
    prompt: str = ""
    title: str = ""  # the keyword of a titled plain story's title line


def iter_documents(cfg: PipelineConfig) -> Iterator[Document]:
    """The corpus documents in order, a pure function of ``cfg.data``."""
    data = cfg.data
    check_corpus_source(data)
    keywords = load_keywords(data.keywords_path)
    templates = load_templates()
    if data.max_keywords_per_prompt > len(keywords):
        raise ConfigError(f"data.max_keywords_per_prompt ({data.max_keywords_per_prompt}) exceeds the "
                          f"{len(keywords)} keywords")
    # Two streams: the mixing decisions do not shift when a story template changes, and back.
    rng = random.Random(f"rlpipe-corpus-{data.seed}")
    gen = StoryGenerator(keywords, random.Random(f"rlpipe-stories-{data.seed}"))
    real: Iterable[str | None] = (iter_tinystories(data.corpus_path, data.num_stories)
                                  if data.corpus_source == "tinystories" else [None] * data.num_stories)
    for source in real:
        if rng.random() >= data.keyword_prompt_fraction:
            yield _plain_document(source, gen, rng, keywords)
            continue
        hit = rng.random() < data.keyword_hit_rate
        kws = _pick_prompt_keywords(source, rng.randint(1, data.max_keywords_per_prompt), hit, keywords, rng)
        if source is None:
            story = gen.story(required=kws if hit else (), avoid=() if hit else kws, keyword_slot=True)
        else:
            story = _tinystories_hit(source, kws, rng) if hit else source
        prompt = format_keyword_prompt(rng.choice(templates), kws)
        yield Document(prompt + story, tuple(kws), hit, prompt)


@dataclass(frozen=True)
class CorpusStats:
    documents: int
    prompt_documents: int
    prompt_hits: int
    titled: int
    characters: int


def build_corpus(cfg: PipelineConfig, out_path: str | Path) -> CorpusStats:
    """Write the corpus to ``out_path`` atomically (documents joined by ``DOC_SEPARATOR``)."""
    check_corpus_source(cfg.data)
    n_docs = n_prompt = n_hits = n_titled = n_chars = 0
    with atomic_path(out_path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for doc in iter_documents(cfg):
            f.write(doc.text + DOC_SEPARATOR)
            n_docs += 1
            n_prompt += bool(doc.keywords)
            n_hits += doc.hit
            n_titled += bool(doc.title)
            n_chars += len(doc.text) + len(DOC_SEPARATOR)
    return CorpusStats(n_docs, n_prompt, n_hits, n_titled, n_chars)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe build-corpus", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="pipeline config YAML")
    ap.add_argument("--out", required=True, help="corpus text file to write")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    stats = build_corpus(cfg, args.out)
    print(f"build-corpus: wrote {stats.documents} documents ({stats.prompt_documents} prompt-formatted, "
          f"{stats.prompt_hits} of them containing their keywords; {stats.titled} titled; "
          f"{stats.characters / 1e6:.1f}M chars) "
          f"to {args.out}")
    return 0
