"""The MATH prompt templates (``tasks/math/prompts/*.prompt``, package data).

Reworded from seed 001; ``r1_zero`` keeps the seed's structure (User/Assistant, ``<think>
</think>`` then ``<answer> </answer>``, ends with ``"Assistant: <think>"``). The grader needs the
closing ``</answer>``: sample with ``stop=("</answer>",)`` and ``include_stop_str_in_output=True``,
as seed 001 does.
"""

from __future__ import annotations

import functools
import importlib.resources

PROMPT_NAMES = ("r1_zero", "question_only")


@functools.cache
def load_prompt(name: str) -> str:
    """The template ``rlpipe/tasks/math/prompts/<name>.prompt`` (package data), without the file's final
    newline, so ``r1_zero`` ends exactly with ``"Assistant: <think>"``."""
    if name not in PROMPT_NAMES:
        raise ValueError(f"unknown prompt {name!r}; prompts: {list(PROMPT_NAMES)}")
    text = importlib.resources.files("rlpipe").joinpath("tasks", "math", "prompts", f"{name}.prompt").read_text("utf-8")
    return text.removesuffix("\n")


def format_math_prompt(name: str, question: str) -> str:
    """Insert ``question`` at ``{question}``. Plain replacement, not ``str.format``: questions are
    full of LaTeX braces."""
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    return load_prompt(name).replace("{question}", question)

