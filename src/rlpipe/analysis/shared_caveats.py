"""A caveat that several answers share, said once where the answers begin, each answer linking to it.

The family answers each close with how far their runs are scaled down from the seeds' protocols
(``rlpipe.analysis.scale_text``); when every family ran at the same scale that sentence is the same
in every answer, and the answers page repeated it eight times. ``hoist`` finds each caveat sentence
(one that opens with a ``PREFIXES`` entry) said verbatim in two or more answers, and the page
renderers (``rlpipe.analysis.deliverables``) write it once, under its own anchor before the first
answer, and put a link in its place in each answer. A caveat said by one answer only stays where it is.
The answer functions themselves are unchanged: each still returns its full text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

#: sentence openings of the caveats that may be shared (scale_text's scale sentence)
PREFIXES = ("Scaled down:",)
ANCHOR = "caveat-{i}"


@dataclass(frozen=True)
class Caveat:
    anchor: str
    text: str

    @property
    def label(self) -> str:
        """The words before the colon ("Scaled down"), the link's text."""
        return self.text.split(":", 1)[0]


def shared(texts: list[list[str]]) -> list[Caveat]:
    """The caveats said verbatim in two or more of ``texts`` (each an answer's sentences), in the
    order they first appear."""
    counts = Counter(s for text in texts for s in dict.fromkeys(text) if s.startswith(PREFIXES))
    seen = [s for text in texts for s in text if counts[s] >= 2]
    return [Caveat(ANCHOR.format(i=i + 1), s) for i, s in enumerate(dict.fromkeys(seen))]


def hoist(texts: list[list[str]], link: Callable[[Caveat], str]) -> tuple[list[Caveat], list[list[str]]]:
    """(the shared caveats, each answer with every shared caveat replaced by ``link(caveat)``)."""
    caveats = shared(texts)
    by_text = {c.text: c for c in caveats}
    return caveats, [[link(by_text[s]) if s in by_text else s for s in text] for text in texts]


def markdown_link(c: Caveat) -> str:
    return f"{c.label}: see [the note where the answers begin](#{c.anchor})."


def markdown_block(caveats: list[Caveat]) -> list[str]:
    """The caveats, each once under its anchor, for the top of the answers."""
    out = []
    for c in caveats:
        out += [f'<a id="{c.anchor}"></a>', f"**Applies to every answer that links here.** {c.text}", ""]
    return out
