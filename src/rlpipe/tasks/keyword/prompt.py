"""Keyword prompts: rlpipe's own templates (``prompts/keyword_templates.txt``, one per line).

``{keywords}`` is replaced by the keywords joined with ``", "`` (``"apple, red"``, as in the seed's
two-keyword example); ``{s}`` by ``""`` for one keyword and ``"s"`` for several, so one template
serves both ("the word: apple" / "the words: apple, red"). The prompt is the formatted template
followed by exactly one ``"\n"``: the model's response starts right after it. The pretraining
corpus and the GRPO dataset both format prompts here, so they agree byte for byte.
"""

from __future__ import annotations

import string
from importlib import resources
from pathlib import Path

PROMPT_END = "\n"
KEYWORD_JOINER = ", "
_PLACEHOLDERS = {"keywords", "s"}


def load_templates(path: str | Path | None = None) -> list[str]:
    """Prompt templates (default: the packaged file); each must contain ``{keywords}``."""
    if path is None:
        path_in_package = "tasks/keyword/prompts/keyword_templates.txt"
        text = resources.files("rlpipe").joinpath(path_in_package).read_text(encoding="utf-8")
        where = "rlpipe/tasks/keyword/prompts/keyword_templates.txt"
    else:
        text, where = Path(path).read_text(encoding="utf-8"), str(path)
    templates = []
    for lineno, line in enumerate(text.splitlines(), 1):
        t = line.strip()
        if not t or t.startswith("#"):
            continue
        fields = {f for _, f, _, _ in string.Formatter().parse(t) if f is not None}
        if "keywords" not in fields or not fields <= _PLACEHOLDERS:
            raise ValueError(f"{where}:{lineno}: template must use {{keywords}} and only "
                             f"{sorted(_PLACEHOLDERS)} placeholders: {t!r}")
        templates.append(t)
    if not templates:
        raise ValueError(f"{where}: no templates")
    return templates


def format_keyword_prompt(template: str, keywords: list[str] | tuple[str, ...]) -> str:
    """The exact model input: ``"Write a story that includes the word: apple\\n"``."""
    if not keywords:
        raise ValueError("format_keyword_prompt needs at least one keyword")
    body = template.format(keywords=KEYWORD_JOINER.join(keywords), s="" if len(keywords) == 1 else "s")
    return body + PROMPT_END
