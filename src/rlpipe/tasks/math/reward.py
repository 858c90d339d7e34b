"""MATH rewards: ``r1_zero_reward_fn`` and ``question_only_reward_fn`` (seeds 001 and 004).

* ``r1_zero_reward_fn(response, ground_truth, fast=True)`` (seed 001 §3, the ``r1_zero`` prompt):
  format = 1 iff the response contains ``"</think> <answer>"`` (one space, as the seed grader
  checks) followed later by ``"</answer>"``. The answer is the text between them (the content of
  its last ``\\boxed{}`` if it has one); answer = 1 iff format = 1 and it is equivalent under
  math-verify to the ground truth (or one of them, for a list). reward = answer.
* ``question_only_reward_fn(response, ground_truth, fast=True)`` (seed 004 prompt ablation): no
  format to obey. The answer is the content of the response's last ``\\boxed{}``; without one,
  math-verify's own extraction on the response's last 1,000 characters, XML-like tags blanked
  ("final answer is", the last ``$...$``, the last number). format = 1 iff an answer was read;
  reward = answer.

Both take ``strict`` (None: the default set by ``configure_math_grader``): ``strict=True``
grades like the course's grader (simplified answers, exact decimals) for comparable accuracies.
Equivalence, its departures from the course grader and its time bounds: ``rlpipe.tasks.math.grader``.
"""

from __future__ import annotations

from typing import Any

from rlpipe.tasks.math.grader import (
    MAX_TAIL_CHARS,
    _grade,
    answers_match,
    last_boxed,
    r1_zero_answer,
)
from rlpipe.tasks.reward_dict import RewardDict, never_raise, scores, zeros

# --------------------------------------------------------------------------- MATH graders


@never_raise
def r1_zero_reward_fn(response: str, ground_truth: Any, fast: bool = True, strict: bool | None = None) -> RewardDict:
    """Grade a continuation of the ``r1_zero`` prompt (it starts inside ``<think>``).

    format_reward = 1 iff ``"</think> <answer>"`` and then ``"</answer>"`` occur. The answer is the
    text between them, or the content of its last ``\\boxed{}`` when it has one (an unclosed
    ``\\boxed{`` is no answer). answer_reward = 1 iff format_reward = 1 and ``answers_match``.
    reward = answer_reward (so 1 only when format and answer are both right). ``strict``: the
    course-comparable grading of ``rlpipe.tasks.math.grader`` (None: ``configure_math_grader``'s).
    """
    if not isinstance(response, str):
        return zeros()
    answer = r1_zero_answer(response)
    if answer is None:
        return zeros()
    if "\\boxed{" in answer:
        answer = last_boxed(answer)
    return scores(True, answer is not None and answers_match(answer, ground_truth, fast, strict))


@never_raise
def question_only_reward_fn(response: str, ground_truth: Any, fast: bool = True,
                            strict: bool | None = None) -> RewardDict:
    """Grade a response to the bare-question prompt (no format requirement).

    The answer is the content of the last ``\\boxed{}`` (an unclosed one: no answer); without
    one, math-verify reads the last ``MAX_TAIL_CHARS`` characters itself, XML-like tags replaced
    by spaces (its "final answer is" anchors, the last ``$...$``, the last number).
    format_reward = 1 iff an answer was read; reward = answer_reward. ``strict`` as above.
    """
    if not isinstance(response, str):
        return zeros()
    if "\\boxed{" in response:
        boxed = last_boxed(response)
        found, ok = _grade("answer", boxed, ground_truth, fast, strict) if boxed is not None else (False, False)
    else:
        found, ok = _grade("prose", response[-MAX_TAIL_CHARS:], ground_truth, fast, strict)
    return scores(found, ok) if found else zeros()

