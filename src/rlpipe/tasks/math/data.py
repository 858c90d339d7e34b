"""MATH / GSM8K JSONL files -> ``Example(prompt, ground_truth)`` (seed 001 §2-3).

Seed 001 loads MATH's ``validation.jsonl`` (records with ``problem``, ``solution`` and a short
``answer``), formats each problem with the ``r1_zero`` prompt and grades against the answer; where a
dataset has no short answer, it says to take one from the solution with a math answer parser.
``load_math_jsonl`` does that for any JSONL file of problems, field names configurable:

* the prompt is ``format_math_prompt(prompt, record[problem_field])``;
* the ground truth (a string) is the record's ``answer_field`` when present and non-empty (a
  number is stringified); otherwise it is read off ``solution_field``. A worked solution gives its
  final answer as the content of its last ``\\boxed{}`` (MATH; ``grader.last_boxed``) or, GSM8K
  style, as the text after its last ``####`` (``"... #### 72"``; thousands commas are dropped,
  ``1,600`` -> ``1600``). GSM8K keeps that worked solution in its ``answer`` field, so an answer
  value holding ``####`` or ``\\boxed{`` is reduced the same way: GSM8K loads with
  ``problem_field="question"`` and the other defaults.
* a ground truth taken out of a solution must parse under math-verify (``grader.parses``), so a
  broken extraction stops the load instead of silently scoring every response 0. Short answers
  given as such are trusted (they may be text, e.g. ``\\text{Monday}``).

Errors name the file and line: a missing file, malformed JSON, a line that is not an object, a
missing problem field or ground truth (with the fields the record does have), an empty ``\\boxed{}``.
Blank lines are skipped; a file with no records is an error.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlpipe.tasks.base import Example
from rlpipe.tasks.jsonl import jsonl_records
from rlpipe.tasks.math.grader import last_boxed, parses
from rlpipe.tasks.math.prompt import format_math_prompt, load_prompt

_GSM8K_MARK = "####"
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")


class MathDataError(ValueError):
    """A MATH/GSM8K data file cannot be turned into examples; the message says where and why."""


def final_answer(solution: str) -> str | None:
    """The final answer written in a worked solution: the last ``\\boxed{}``'s content, else the
    text after the last ``####`` (GSM8K, thousands commas dropped); None when it has neither.
    An unclosed ``\\boxed{`` counts as none."""
    if "\\boxed{" in solution:
        boxed = last_boxed(solution)
        if boxed is not None:
            return boxed.strip()
    if _GSM8K_MARK in solution:
        return _THOUSANDS.sub("", solution.rsplit(_GSM8K_MARK, 1)[1].strip())
    return None


def _where(path: Path, line: int) -> str:
    return f"{path}:{line}"


def _ground_truth(record: dict, where: str, answer_field: str | None, solution_field: str | None) -> str:
    """The record's ground truth (see the module doc)."""
    answer = record.get(answer_field) if answer_field else None
    if isinstance(answer, bool) or not (answer is None or isinstance(answer, (str, int, float))):
        raise MathDataError(f"{where}: field {answer_field!r} must be a string or a number, "
                            f"got {type(answer).__name__} {answer!r}"[:300])
    if isinstance(answer, (int, float)):
        return str(answer)
    if answer is not None and answer.strip():
        if _GSM8K_MARK not in answer and "\\boxed{" not in answer:
            return answer.strip()
        source, text = answer_field, answer  # a worked solution in the answer field (GSM8K)
    else:
        text = record.get(solution_field) if solution_field else None
        source = solution_field
        if not isinstance(text, str) or not text.strip():
            asked = [f for f in (answer_field, solution_field) if f]
            raise MathDataError(f"{where}: no ground truth: the record has no non-empty "
                                f"{' or '.join(repr(f) for f in asked)} field; its fields are {sorted(record)}")
    truth = final_answer(text)
    if truth is None:
        raise MathDataError(f"{where}: no ground truth: field {source!r} has no closed \\boxed{{...}} and no "
                            f"'{_GSM8K_MARK} answer' (it ends {text.strip()[-80:]!r})")
    if not truth or not parses(truth):
        raise MathDataError(f"{where}: the final answer {truth!r} taken from field {source!r} does not parse "
                            "as math under math-verify")
    return truth


def _records(path: Path):
    """(line number, JSON object) for every non-blank line of ``path``."""
    return jsonl_records(path, MathDataError, "MATH data file")


def load_math_jsonl(
    path: str | Path,
    prompt: str = "r1_zero",
    *,
    problem_field: str = "problem",
    answer_field: str | None = "answer",
    solution_field: str | None = "solution",
    limit: int | None = None,
) -> list[Example]:
    """Examples from a MATH- or GSM8K-style JSONL file (see the module doc), in file order.

    ``prompt``: a template name (``rlpipe.tasks.math.prompt.PROMPT_NAMES``). ``answer_field`` /
    ``solution_field``: None to ignore that field. ``limit``: keep only the first that-many records.
    """
    load_prompt(prompt)  # an unknown template name fails before any reading
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    path = Path(path)
    examples: list[Example] = []
    for lineno, record in _records(path):
        where = _where(path, lineno)
        problem = record.get(problem_field)
        if not isinstance(problem, str) or not problem.strip():
            state = "is missing" if problem_field not in record else f"is not a non-empty string ({problem!r})"[:200]
            raise MathDataError(f"{where}: problem field {problem_field!r} {state}; "
                                f"the record's fields are {sorted(record)}")
        truth = _ground_truth(record, where, answer_field, solution_field)
        examples.append(Example(prompt=format_math_prompt(prompt, problem), ground_truth=truth))
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        raise MathDataError(f"MATH data file {path} holds no records")
    return examples

