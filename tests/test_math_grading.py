"""MATH grading policy (rlpipe.tasks.math.grader): the three fixes found against a reference MATH
grader (decimal percentages, ``\\varnothing``, choice-letter lists) and the ``strict`` mode that
grades like the course's grader (simplified answers, exact decimals), in the child process and in
process. Expected verdicts are written by hand from the policy in the grader's module docstring.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlpipe.tasks.math import grader
from rlpipe.tasks.math.answer_forms import choice_letters
from rlpipe.tasks.math.grader import answers_match, configure_math_grader, parses
from rlpipe.tasks.math.reward import question_only_reward_fn, r1_zero_reward_fn

RIGHT = {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}
WRONG = {"reward": 0.0, "format_reward": 1.0, "answer_reward": 0.0}
QUICK = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def r1(answer: str) -> str:
    return f"Let me think. </think> <answer>{answer}</answer>"


@pytest.fixture(params=["child process", "in process"])
def grader_mode(request):
    configure_math_grader(isolated=request.param == "child process")
    yield request.param
    configure_math_grader()


# --------------------------------------------------------------------------- the three fixes

# (answer, ground truth, default verdict, strict verdict)
FIXES = [
    # decimal percentages: math-verify alone scored these 0
    (r"12.5\%", "12.5", True, True),
    ("12.5", r"12.5\%", True, True),
    ("12.5%", "12.5", True, True),
    (r"$12.5\%$", "12.5", True, True),
    (r"12.5\text{\%}", "12.5", True, True),
    (r"12.5\%", "0.125", True, False),  # the percent reading stays in the default; strict strips \%
    (r"12.5\%", "12.6", False, False),
    (r"50\%", "50", True, True),  # integers worked before and still do
    ("0.25", r"25\%", True, False),
    # the empty set
    (r"\varnothing", r"\emptyset", True, True),
    (r"\emptyset", r"\varnothing", True, True),
    (r"\{\}", r"\varnothing", True, True),
    (r"\varnothing", r"\{1\}", False, False),
    # lists of choice letters
    ("A, C", r"\text{A,C}", True, True),
    ("A,C", r"\text{A,C}", True, True),
    (r"\text{A, C}", "A,C", True, True),
    ("(A), (C)", r"\text{A,C}", True, True),
    ("A and C", r"\text{(A), (C)}", True, True),
    ("C, A", r"\text{A,C}", True, True),  # a set of choices: order does not matter
    ("A, B", r"\text{A,C}", False, False),
    ("A", r"\text{A,C}", False, False),
    ("A, C, E", r"\text{A,C}", False, False),
    (r"\textbf{(B)}", "B", True, True),
    ("B", r"\text{(A)}", False, False),
]


@pytest.mark.parametrize("answer, gold, default, strict", FIXES)
def test_fixed_answer_kinds(answer, gold, default, strict):
    assert r1_zero_reward_fn(r1(answer), gold) == (RIGHT if default else WRONG)
    assert r1_zero_reward_fn(r1(answer), gold, strict=True) == (RIGHT if strict else WRONG)


@pytest.mark.parametrize("text, letters", [
    ("A, C", ("A", "C")), (r"\text{C,A}", ("A", "C")), (r"$\textbf{(B)}$", ("B",)), ("(A) and (D).", ("A", "D")),
    ("A;B", ("A", "B")), ("a, c", None), ("AB", None), ("A, ", None), ("1, 2", None), ("", None), (None, None),
    (r"\text{Monday}", None),
])
def test_choice_letters(text, letters):
    assert choice_letters(text) == letters


def test_lowercase_letters_still_go_to_math_verify():
    # only capital-letter lists take the letter path; lowercase ones are symbols, graded as before
    assert r1_zero_reward_fn(r1("a, c"), "a, c") == RIGHT
    assert r1_zero_reward_fn(r1("a, c"), r"\text{A,C}") == WRONG  # math-verify: a set vs a tuple
    assert r1_zero_reward_fn(r1("x"), "y") == WRONG


# --------------------------------------------------------------------------- lenient default vs strict

# (answer, ground truth, default, strict)
STRICTNESS = [
    ("2+2", "4", True, False),  # unsimplified
    ("5!", "120", True, False),
    (r"\frac{2}{4}", r"\frac12", True, False),
    ("2/4", "0.5", True, False),
    (r"\frac{8}{2}", "4", True, False),
    (r"\frac{4}{1}", "4", True, False),
    ("10^{3}", "1000", True, False),
    ("(1+1, 3)", "(2,3)", True, False),  # element by element
    (r"\{\frac{2}{4}, 1\}", r"\{\frac12, 1\}", True, False),
    ("0.333333", r"\frac13", True, False),  # a 6-decimal approximation
    ("1.414214", r"\sqrt{2}", True, False),
    ("0.5", r"\frac12", True, True),  # terminating decimals are exact
    ("0.125", r"\frac18", True, True),
    (r"\frac{1}{2}", "0.5", True, True),
    ("1/2", r"\frac{1}{2}", True, True),
    (r"\dfrac{3}{4}", "0.75", True, True),
    (r"-\frac{3}{4}", "-0.75", True, True),
    (r"\frac{-3}{4}", r"-\frac34", True, True),
    ("4.0", "4", True, True),
    ("1,000", "1000", True, True),
    ("x = 5", "5", True, True),
    (r"90^\circ", "90", True, True),
    (r"5\text{ cm}", "5", True, True),
    (r"\$5", "5", True, True),
    ("(1, 2]", "(1,2]", True, True),
    (r"(-\infty, 3)", r"(-\infty,3)", True, True),
    ("1, 2, 3", r"\{3,2,1\}", True, True),
    (r"\frac{2}{4}", r"\frac{2}{4}", True, True),  # spelled as the ground truth spells it
    (r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt2}{2}", True, True),  # irrational: form not judged
    ("x^2+2x+1", "(x+1)^2", True, True),  # symbolic: form not judged
    ("4x+10", "4x + 10", True, True),
    (r"\text{Monday}", r"\text{Monday}", True, True),
    ("0.333", r"\frac13", False, False),
    ("3", "4", False, False),
]


@pytest.mark.parametrize("answer, gold, default, strict", STRICTNESS)
def test_strict_rejects_unsimplified_answers_and_approximations(answer, gold, default, strict):
    assert answers_match(answer, gold) is default
    assert answers_match(answer, gold, strict=True) is strict
    assert r1_zero_reward_fn(r1(answer), gold, strict=True) == (RIGHT if strict else WRONG)


def test_strict_in_question_only():
    assert question_only_reward_fn(r"so \boxed{2+2}", "4") == RIGHT
    assert question_only_reward_fn(r"so \boxed{2+2}", "4", strict=True) == WRONG
    assert question_only_reward_fn("so it is 0.333333", r"\frac13") == RIGHT  # prose: math-verify's extraction
    assert question_only_reward_fn("so it is 0.333333", r"\frac13", strict=True) == WRONG
    assert question_only_reward_fn("so it is 0.5", r"\frac12", strict=True) == RIGHT


def test_strict_reaches_the_child_process_and_matches_in_process():
    request = {"kind": "answer", "text": "2+2", "golds": ["4"], "fast": True}
    assert grader._GRADER.request(request, 60.0) == (True, True)  # a request without the key: lenient
    assert grader._GRADER.request(request | {"strict": True}, 60.0) == (True, False)
    assert grader._GRADER.request(request | {"strict": False}, 60.0) == (True, True)
    sample = [(a, g, s) for a, g, _, s in STRICTNESS[::2] + FIXES[::3]]
    isolated = [answers_match(a, g, strict=True) for a, g, _ in sample]
    try:
        configure_math_grader(isolated=False)
        local = [answers_match(a, g, strict=True) for a, g, _ in sample]
    finally:
        configure_math_grader()
    assert local == isolated == [s for _, _, s in sample]


def test_configured_default(grader_mode):
    configure_math_grader(isolated=grader_mode == "child process", strict=True)
    assert r1_zero_reward_fn(r1(r"\frac{2}{4}"), r"\frac12") == WRONG  # strict=None: the configured default
    assert r1_zero_reward_fn(r1(r"\frac{2}{4}"), r"\frac12", strict=False) == RIGHT  # a call overrides it
    configure_math_grader(isolated=grader_mode == "child process")  # strict back to False
    assert r1_zero_reward_fn(r1(r"\frac{2}{4}"), r"\frac12") == RIGHT
    with pytest.raises(TypeError, match="strict"):
        configure_math_grader(strict="yes")


@QUICK
@given(p=st.integers(-60, 60), q=st.integers(1, 40), form=st.sampled_from(["frac", "slash", "decimal", "sum"]))
def test_strict_oracle_for_rational_answers(p, q, form):
    """Hand-derivable rule: against the reduced gold p/q, strict accepts an answer iff it is a
    reduced fraction, an integer, or a decimal whose value is exactly p/q."""
    value = Fraction(p, q)
    gold = str(value.numerator) if value.denominator == 1 else rf"\frac{{{value.numerator}}}{{{value.denominator}}}"
    sign = "-" if p < 0 else ""
    if form == "frac":
        answer, expected = rf"{sign}\frac{{{abs(p)}}}{{{q}}}", q > 1 and math.gcd(p, q) == 1
    elif form == "slash":
        answer, expected = f"{p}/{q}", q > 1 and math.gcd(p, q) == 1
    elif form == "decimal":
        answer = f"{float(value):.6f}"
        expected = Fraction(answer) == value
    else:  # an unsimplified sum: p/q written as (p - 1)/q + 1/q, never accepted
        answer, expected = rf"\frac{{{p - 1}}}{{{q}}} + \frac{{1}}{{{q}}}", False
    assert answers_match(answer, gold, strict=True) is expected, (answer, gold)
    assert answers_match(answer, gold) is True  # the default accepts every form (6-decimal rounding)


FRAGMENTS = ["\\frac{", "}", "{", "1", "2", "4", "0.5", "0.333333", "\\%", "%", "$", "+", "-", "!", "^", "(", ")", "[",
             "]", "\\{", "\\}", ",", "\\sqrt{", "x", "=", "\\infty", "\\varnothing", "\\emptyset", "A", "C",
             "\\text{", "(A)", " and ", ".", " ", "10", "3", "/", "\\cdot", "\\pi", "\\dfrac"]
GOLDS = [r"\frac12", "4", r"12.5\%", "(1,2]", r"\{1,2\}", r"\emptyset", r"\text{A,C}", "x+1", r"\sqrt2", "-3"]


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join), gold=st.sampled_from(GOLDS))
def test_strict_never_raises_and_accepts_only_what_the_default_accepts(text, gold):
    # in process, so a crash surfaces here (the child process would report it as a score of 0)
    found, lenient = grader._grade_local("answer", text, [gold], True, False)
    found_strict, strict = grader._grade_local("answer", text, [gold], True, True)
    assert isinstance(strict, bool) and (found_strict or not strict)
    assert lenient or not strict, (text, gold)


# --------------------------------------------------------------------------- helpers used by the data loader


@pytest.mark.parametrize("answer, ok", [
    ("42", True), (r"\frac{1}{2}", True), (r"\text{Monday}", True), (r"(1, 2]", True), (r"12.5\%", True),
    ("", False), ("   ", False), (None, False), (r"\frac{", False),
])
def test_parses(answer, ok):
    assert parses(answer) is ok
