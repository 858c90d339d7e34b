"""The keyword vocabulary: rlpipe's own list of 400+ concrete nouns (``data/keywords.txt``:
animals, foods, toys, objects, clothes, places, nature, story characters), one lowercase word per
line, and the mention rule shared by the corpus and the reward."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from rlpipe.config import ConfigError
from rlpipe.tasks.keyword.reward import mentions_keyword


def load_keywords(path: str | Path | None = None) -> list[str]:
    """The keyword list: ``path`` (one word per line) or the packaged ``tasks/keyword/data/keywords.txt``.

    Words are lower-cased and de-duplicated in file order; blank lines and ``#`` comments are
    skipped. A word with whitespace or an empty list is an error naming the file.
    """
    if path is None:
        text = resources.files("rlpipe").joinpath("tasks/keyword/data/keywords.txt").read_text(encoding="utf-8")
        where = "rlpipe/tasks/keyword/data/keywords.txt"
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"data.keywords_path: file not found: {p}")
        text, where = p.read_text(encoding="utf-8"), str(p)
    words: list[str] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        word = line.strip().lower()
        if not word or word.startswith("#"):
            continue
        if not re.fullmatch(r"[a-z][a-z'-]*", word):
            raise ConfigError(f"{where}:{lineno}: keyword {line.strip()!r} is not a single word")
        if word not in seen:
            seen.add(word)
            words.append(word)
    if not words:
        raise ConfigError(f"{where}: no keywords")
    return words


def mentions(text: str, word: str) -> bool:
    """Whether ``text`` mentions ``word`` by the reward's own rule
    (``reward.mentions_keyword``: whole words, case-insensitive, regular plurals). Used to make
    sure a "miss" story really misses: any other rule would let the reward count some misses."""
    return mentions_keyword(text, word)


def with_article(word: str) -> str:
    """``"an apple"``, ``"a unicorn"``, ``"a dog"`` (spelling heuristic, good enough for nouns)."""
    vowel = word[0] in "aeiou" and not word.startswith(("uni", "use", "eu", "one"))
    return f"{'an' if vowel else 'a'} {word}"
