"""Number formatting and the section record of the report's computed text (shared by every module
that writes report sentences)."""

from __future__ import annotations

import json
import math


def nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fnum(x, digits: int = 3) -> str:
    return "n/a" if nan(x) else f"{x:.{digits}g}"


def fsec(x) -> str:
    if nan(x):
        return "n/a"
    return f"{x * 1e3:.3g} ms" if abs(x) < 1 else f"{x:.3g} s"


def fx(x) -> str:
    """A ratio such as a speedup: two decimals, so 1.003 never reads as a bare "1"."""
    return "n/a" if nan(x) else f"{x:.2f}x"


def fpct(x) -> str:
    return "n/a" if nan(x) else f"{100 * x:.0f}%"


def words(value) -> str:
    """A ground truth as a reader reads it: a list of keywords (or its JSON text, as the summary
    stores non-string ground truths) becomes ``cupcake, bread``; anything else is its text."""
    if isinstance(value, str) and value.startswith("["):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, (list, tuple)):
        return ", ".join(str(x) for x in value)
    return "" if value is None else str(value)


def section(sid: str, title: str, sentences: list[str], numbers: dict | None = None) -> dict:
    clean = {k: (None if nan(v) else v) for k, v in (numbers or {}).items()}
    return {"id": sid, "title": title, "sentences": sentences, "numbers": clean}
