"""Property tests for the task rewards (rlpipe.tasks.*.reward): the graders never raise, always
return the three keys with values in [0, 1], and agree with hand-derivable truths on generated inputs.

Runs are derandomized (the same examples every run: a failure reproduces) and short, because
math-verify costs ~10 ms per answer.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlpipe.tasks.keyword.reward import keyword_inclusion_reward_fn
from rlpipe.tasks.math import grader as rewards
from rlpipe.tasks.math.reward import question_only_reward_fn, r1_zero_reward_fn
from rlpipe.tasks.sorting.reward import (
    sort_distance_reward,
    sort_distance_reward_fn,
    sort_inclusion_ordering_reward,
    sort_inclusion_ordering_reward_fn,
)

KEYS = {"reward", "format_reward", "answer_reward"}
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
QUICK = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

FRAGMENTS = [
    "<think>", "</think>", "<answer>", "</answer>", "</think> <answer>", " ", "\n", "$", "\\$", "\\boxed{", "{", "}",
    "(", ")", "[", "]", "\\{", "\\}", "\\frac{", "\\dfrac", "\\sqrt{", "^", "_", "!", "\\infty", "\\pi", "\\left(",
    "\\right)", "\\text{", "\\%", "%", "\\cdot", "\\times", "\\log", "\\sin", "\\int", "\\sum_{", "\\begin{pmatrix}",
    "\\end{pmatrix}", "\\\\", "&", "=", "+", "-", "/", ",", ".", "x", "y", "e", "i", "0", "1", "2", "9", "10", "99",
    "123456789", "0.5", "The answer is ", "so", "é", "\u0301", "\ud800", "\x00", "😀", "ﬁ",
]
fragment_text = st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join)
any_text = st.one_of(fragment_text, st.text(max_size=200),
                     st.builds(lambda a, b: a + b, st.text(max_size=50), fragment_text))
ground_truths = st.one_of(
    fragment_text, st.text(max_size=30), st.integers(), st.floats(allow_nan=True), st.none(),
    st.lists(st.one_of(fragment_text, st.integers(), st.none()), max_size=3),
)


def check_dict(out: dict, binary: bool = True) -> None:
    assert set(out) == KEYS
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in out.values()), out
    if binary:
        assert all(v in (0.0, 1.0) for v in out.values()), out
        assert out["answer_reward"] <= out["format_reward"]
        assert out["reward"] == out["answer_reward"]


@pytest.fixture(autouse=True)
def no_grader_errors(caplog):
    """A crash inside a grader (scored 0 and logged, never raised) still fails these tests."""
    with caplog.at_level(logging.WARNING, logger="rlpipe.rewards"):
        yield
    errors = [r.getMessage() for r in caplog.records if "error" in r.getMessage() or "failed" in r.getMessage()]
    assert not errors, errors[:3]


@FUZZ
@given(body=any_text, gold=ground_truths, fast=st.booleans())
def test_r1_zero_never_raises(body, gold, fast):
    check_dict(r1_zero_reward_fn(body, gold, fast=fast))
    check_dict(r1_zero_reward_fn("reasoning </think> <answer>" + body + "</answer>", gold, fast=fast))


@FUZZ
@given(body=any_text, gold=ground_truths)
def test_question_only_never_raises(body, gold):
    check_dict(question_only_reward_fn(body, gold))


@FUZZ
@given(response=any_text, keywords=st.one_of(any_text, st.lists(any_text, max_size=4), st.none(), st.integers()))
def test_keyword_never_raises(response, keywords):
    out = keyword_inclusion_reward_fn(response, keywords)
    check_dict(out, binary=False)
    assert out["reward"] == out["answer_reward"] and all(v in (0.0, 1.0) for v in out.values())


@pytest.mark.timeout(300)  # in process there is no time limit: a runaway would otherwise hang
@QUICK
@given(text=fragment_text)
def test_in_process_grading_never_raises(text):
    # The child process reports crashes as scores of 0; run the same code here so one would surface.
    for kind in ("answer", "prose"):
        found, ok = rewards._grade_local(kind, text, ["1/2", "x+1"], fast=True)
        assert isinstance(found, bool) and isinstance(ok, bool) and (found or not ok)


# --------------------------------------------------------------------------- properties


@QUICK
@given(n=st.integers(-10**6, 10**6), pad=st.sampled_from(["", " ", "The answer is ", r"\boxed{"]))
def test_integers_match_themselves_and_not_neighbours(n, pad):
    answer = pad + str(n) + ("}" if pad == r"\boxed{" else "")
    assert r1_zero_reward_fn(f"t </think> <answer>{answer}</answer>", str(n))["reward"] == 1.0
    assert r1_zero_reward_fn(f"t </think> <answer>{answer}</answer>", str(n + 1))["reward"] == 0.0


@QUICK
@given(p=st.integers(1, 99), q=st.integers(1, 99))
def test_fraction_forms_agree(p, q):
    gold = rf"\frac{{{p}}}{{{q}}}"
    for form in [f"{p}/{q}", rf"\dfrac{{{p}}}{{{q}}}", rf"\frac{{{2 * p}}}{{{2 * q}}}"]:
        assert r1_zero_reward_fn(f"t </think> <answer>{form}</answer>", gold)["reward"] == 1.0, form
    wrong = f"{p + 1}/{q}"
    assert r1_zero_reward_fn(f"t </think> <answer>{wrong}</answer>", gold)["reward"] == 0.0


@FUZZ
@given(before=st.text(max_size=40), after=st.text(max_size=40), kw=st.from_regex(r"[a-z]{1,10}", fullmatch=True),
       upper=st.booleans())
def test_a_keyword_between_spaces_is_found(before, after, kw, upper):
    response = f"{before} {kw.upper() if upper else kw} {after}"
    assert keyword_inclusion_reward_fn(response, [kw])["reward"] == 1.0


@FUZZ
@given(words=st.lists(st.from_regex(r"[a-z]{1,8}", fullmatch=True), min_size=1, max_size=20),
       kw=st.from_regex(r"[a-z]{3,8}", fullmatch=True))
def test_keyword_matches_only_whole_words(words, kw):
    # Naive reference for ASCII word lists: the keyword (or a regular plural) is one of the words.
    def plural_forms(w):
        forms = {w}
        if w.endswith("y") and w[-2] not in "aeiou":
            forms.add(w[:-1] + "ies")
        if w.endswith(("s", "x", "z", "ch", "sh", "o")):
            forms.add(w + "es")
        if not w.endswith(("s", "x", "z", "ch", "sh")):
            forms.add(w + "s")
        return forms

    expected = float(bool(plural_forms(kw) & set(words)))
    assert keyword_inclusion_reward_fn(" ".join(words) + ".", kw)["reward"] == expected


int_lists = st.lists(st.integers(-5, 15), min_size=1, max_size=8)


@FUZZ
@given(prompt=int_lists, data=st.data())
def test_sort_wrappers_equal_seed_functions_over_their_maximum(prompt, data):
    response = data.draw(st.lists(st.integers(-5, 15), min_size=len(prompt), max_size=len(prompt)))
    n = len(prompt)
    d = sort_distance_reward_fn(" ".join(map(str, response)), prompt)
    i = sort_inclusion_ordering_reward_fn(response, prompt)
    assert d["reward"] == pytest.approx(sort_distance_reward(prompt, response) / n)
    assert i["reward"] == pytest.approx(sort_inclusion_ordering_reward(prompt, response) / (2 * n - 1))
    solved = float(response == sorted(prompt))
    assert d["answer_reward"] == i["answer_reward"] == solved and d["format_reward"] == 1.0
    assert sort_inclusion_ordering_reward_fn(sorted(prompt), prompt)["reward"] == 1.0


@FUZZ
@given(response=st.one_of(any_text, st.lists(st.integers()), st.none()),
       prompt=st.one_of(int_lists, any_text, st.none()))
def test_sort_wrappers_never_raise(response, prompt):
    for fn in (sort_distance_reward_fn, sort_inclusion_ordering_reward_fn):
        out = fn(response, prompt)
        check_dict(out, binary=False)
        assert out["answer_reward"] <= out["format_reward"]
