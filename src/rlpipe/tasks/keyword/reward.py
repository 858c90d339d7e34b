"""Keyword-inclusion reward (seed 000 §3.1).

``keyword_inclusion_reward_fn(response, keywords)``: answer = 1 iff every keyword occurs in the
response under ``mentions_keyword``'s rule (whole words, case-insensitive, simple plural; see
there). format = 1 iff the response has non-blank text. reward = answer.

Departure from the seed: an empty keyword list scores 0, not a vacuous 1: no task asks for zero
keywords, and a free reward would hide a data bug.

A keyword is at most ``MAX_KEYWORD_CHARS`` characters (a word or a short phrase). Compiling its
pattern takes time quadratic in its length (a million-digit keyword would stall the scorer for
hours), so the dataset check refuses a longer one naming file and line, and the reward refuses one
that arrives another way (it raises; ``never_raise`` scores the sample 0 and logs why).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence

from rlpipe.tasks.reward_dict import RewardDict, never_raise, scores, zeros

#: longest keyword, in characters (see the module docstring)
MAX_KEYWORD_CHARS = 100
_WORD = re.compile(r"\w+")
# Between the words of a multi-word keyword: whitespace, hyphens or apostrophes ("o'clock").
_SEPARATOR = r"[\s\-'\u2019]+"


def _normalise(text: str) -> str:
    # NFKC makes composed/decomposed accents and compatibility forms compare equal; casefold is
    # unicode-aware lower-casing ("STRASSE" == "Straße").
    return unicodedata.normalize("NFKC", text).casefold()


def _plural_alternatives(word: str) -> str:
    """Regex for ``word`` or its regular English plural."""
    forms = [re.escape(word)]
    if len(word) >= 2 and word.endswith("y") and word[-2] not in "aeiou":
        forms.append(re.escape(word[:-1]) + "ies")  # baby -> babies
    if word.endswith(("s", "x", "z", "ch", "sh", "o")):
        forms.append(re.escape(word) + "es")  # box -> boxes, potato -> potatoes
    if not word.endswith(("s", "x", "z", "ch", "sh")):
        forms.append(re.escape(word) + "s")  # dog -> dogs, day -> days, photo -> photos
    return "(?:" + "|".join(forms) + ")"


@functools.lru_cache(maxsize=8192)
def _keyword_regex(keyword: str) -> re.Pattern[str] | None:
    words = _WORD.findall(_normalise(keyword))
    if not words:
        return None
    parts = [re.escape(w) for w in words[:-1]] + [_plural_alternatives(words[-1])]
    return re.compile(r"(?<!\w)" + _SEPARATOR.join(parts) + r"(?!\w)")


def mentions_keyword(text: str, keyword: str) -> bool:
    """Whether ``keyword`` occurs in ``text``. The rule:

    * both are NFKC-normalised and case-folded (accents still matter: "cafe" is not "café");
    * the keyword is split into words (runs of unicode letters, digits, ``_``); its other
      characters only separate words; a keyword with no word characters never matches;
    * the words must appear in order as whole words (no letter, digit or ``_`` touching either
      end: "cat" is not found in "category" or "bobcat", but is in "Cat!", "(cat)", "cat's"),
      separated by any run of whitespace, hyphens or apostrophes ("ice cream" matches
      "ice-cream", "o'clock" matches "o'clock");
    * the last word may carry a regular plural: +s, +es after s/x/z/ch/sh/o, consonant+y -> ies
      ("box" -> "boxes", "baby" -> "babies"); irregular plurals ("mice") do not count, nor does a
      singular response word for a plural keyword.
    """
    if len(keyword) > MAX_KEYWORD_CHARS:
        raise ValueError(f"keyword of {len(keyword)} characters (at most {MAX_KEYWORD_CHARS}): {keyword[:40]!r}...")
    pattern = _keyword_regex(keyword)
    return pattern is not None and pattern.search(_normalise(text)) is not None


@never_raise
def keyword_inclusion_reward_fn(response: str, keywords: str | Sequence[str]) -> RewardDict:
    """Seed 000 §3.1: 1 iff every keyword is in the response (``mentions_keyword``). ``keywords``
    is one keyword (a str, possibly several words: a phrase) or a list of them; an empty list, or a
    keyword that is not a str, scores 0. format_reward = 1 iff the response has non-blank text."""
    if not isinstance(response, str):
        return zeros()
    if not isinstance(keywords, (str, list, tuple)):
        return zeros()
    kws = [keywords] if isinstance(keywords, str) else list(keywords)
    ok = bool(kws) and all(isinstance(k, str) and mentions_keyword(response, k) for k in kws)
    return scores(bool(response.strip()), ok)


