"""Task rewards (rlpipe.tasks.*.reward): hand-checked cases for every reward function and the prompt templates.

Expected math verdicts were checked against math-verify 0.9.0 before being written down; forms it
does not support (e.g. "approximately 0.5" in strict mode) are tested as such or left out.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rlpipe.tasks import REWARD_FNS, SORT_REWARD_FNS
from rlpipe.tasks.keyword.reward import keyword_inclusion_reward_fn, mentions_keyword
from rlpipe.tasks.math import grader as rewards
from rlpipe.tasks.math.grader import last_boxed
from rlpipe.tasks.math.prompt import format_math_prompt, load_prompt
from rlpipe.tasks.math.reward import question_only_reward_fn, r1_zero_reward_fn
from rlpipe.tasks.sorting.reward import (
    sort_distance_reward,
    sort_distance_reward_fn,
    sort_inclusion_ordering_reward,
    sort_inclusion_ordering_reward_fn,
)

KEYS = {"reward", "format_reward", "answer_reward"}
ZEROS = {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}
RIGHT = {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}
WRONG = {"reward": 0.0, "format_reward": 1.0, "answer_reward": 0.0}


def r1(answer: str) -> str:
    """A response to the r1_zero prompt (which ends with "Assistant: <think>")."""
    return f"Let me think step by step. </think> <answer>{answer}</answer>"


# --------------------------------------------------------------------------- prompts


def test_prompts_load_from_package_data_and_format():
    r1_zero = load_prompt("r1_zero")
    assert r1_zero.endswith("Assistant: <think>")  # the model continues inside <think>
    assert "{question}" in r1_zero and "<answer> </answer>" in r1_zero and "<think> </think>" in r1_zero
    q = r"What is $\frac{1}{2} + \frac{1}{4}$? Use {braces}."
    p = format_math_prompt("r1_zero", q)
    assert f"User: {q}\nAssistant: <think>" in p  # braces in the question survive (no str.format)
    assert p.index("User:") < p.index("Assistant: <think>") and p.endswith("Assistant: <think>")
    assert load_prompt("question_only") == "{question}"
    assert format_math_prompt("question_only", q) == q


def test_prompt_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="nope"):
        load_prompt("nope")
    with pytest.raises(TypeError, match="question"):
        format_math_prompt("r1_zero", None)


def test_registry():
    assert set(REWARD_FNS) == {"keyword_inclusion", "r1_zero", "question_only"}
    assert REWARD_FNS["r1_zero"] is r1_zero_reward_fn
    assert set(SORT_REWARD_FNS) == {"sort_distance", "sort_inclusion_ordering"}


# --------------------------------------------------------------------------- keyword inclusion


@pytest.mark.parametrize(
    "response, keywords, expected",
    [
        ("The red apple fell from the tree.", ["apple", "red"], 1.0),  # seed 000's example
        ("The red apple fell from the tree.", ["apple", "green"], 0.0),
        ("The red apple fell from the tree.", "apple", 1.0),  # a single str is one keyword
        ("THE APPLE.", "Apple", 1.0),  # case-insensitive both ways
        ("An apple!", "apple", 1.0),  # punctuation around words is ignored
        ("(apple),", "apple", 1.0),
        ("the cat's toy", "cat", 1.0),
        ("a category of things", "cat", 0.0),  # not inside other words
        ("a bobcat", "cat", 0.0),
        ("cat_food", "cat", 0.0),  # "_" is a word character
        ("two apples", "apple", 1.0),  # +s
        ("three boxes", "box", 1.0),  # +es after x
        ("the churches", "church", 1.0),
        ("the buses", "bus", 1.0),
        ("potatoes", "potato", 1.0),
        ("photos", "photo", 1.0),
        ("the babies", "baby", 1.0),  # consonant + y -> ies
        ("sunny days", "day", 1.0),  # vowel + y -> +s
        ("dogses", "dog", 0.0),  # only one plural suffix
        ("doges", "dog", 0.0),  # +es only after s/x/z/ch/sh/o
        ("the mice", "mouse", 0.0),  # irregular plurals are not recognised
        ("one cat", "cats", 0.0),  # a plural keyword needs the plural
        ("ice cream", "ice cream", 1.0),  # phrases
        ("ice \n\t cream", "ice cream", 1.0),  # any whitespace between the words
        ("ice-cream", "ice cream", 1.0),  # or hyphens
        ("icecream", "ice cream", 0.0),
        ("cream ice", "ice cream", 0.0),  # order matters
        ("ice creams", "ice cream", 1.0),  # the last word may be plural
        ("CAFÉ", "café", 1.0),  # unicode case folding
        ("cafe\u0301", "caf\u00e9", 1.0),  # decomposed vs composed accent (NFKC)
        ("cafe", "café", 0.0),  # accents matter
        ("STRASSE", "straße", 1.0),  # casefold, not lower
        ("Ο ΣΊΣΥΦΟΣ", "σίσυφος", 1.0),
        ("我在东京 住", "东京", 0.0),  # CJK runs are words too: 我在东京 is one word
        ("在 东京 住", "东京", 1.0),
        ("", "apple", 0.0),
        ("apple", "", 0.0),  # a keyword without word characters never matches
        ("!!!", "!!!", 0.0),
    ],
)
def test_keyword_rule(response, keywords, expected):
    out = keyword_inclusion_reward_fn(response, keywords)
    assert out["reward"] == out["answer_reward"] == expected


def test_keyword_format_reward_and_degenerate_inputs():
    assert keyword_inclusion_reward_fn("apple", ["apple"]) == RIGHT
    assert keyword_inclusion_reward_fn("pear", ["apple"]) == WRONG  # non-empty text: format 1
    assert keyword_inclusion_reward_fn("", ["apple"]) == ZEROS
    assert keyword_inclusion_reward_fn("   \n", ["apple"]) == ZEROS
    assert keyword_inclusion_reward_fn("anything", []) == WRONG  # empty list: defined as 0
    assert keyword_inclusion_reward_fn("apple", ("apple", "apple")) == RIGHT
    for bad in [None, 3, b"apple", ["apple", None]]:
        assert keyword_inclusion_reward_fn("apple", bad)["reward"] == 0.0
    assert keyword_inclusion_reward_fn(None, "apple") == ZEROS
    assert keyword_inclusion_reward_fn(b"apple", "apple") == ZEROS


def test_overlong_keyword_is_refused_at_once_and_scores_zero(caplog):
    """A keyword of a million digits would stall the pattern compiler (time quadratic in its
    length); longer than MAX_KEYWORD_CHARS it is refused before compiling."""
    huge = "7" * 10**6
    with pytest.raises(ValueError, match="keyword of 1000000 characters \\(at most 100\\)"):
        mentions_keyword("777", huge)
    assert keyword_inclusion_reward_fn("a cat", ["cat", huge]) == ZEROS
    assert mentions_keyword("x " + "a" * 100, "a" * 100)  # the longest allowed still matches


def test_mentions_keyword_scales_to_long_text():
    text = "word " * 200_000 + "a small dog."
    assert mentions_keyword(text, "dog") and not mentions_keyword(text, "cat")


# --------------------------------------------------------------------------- r1_zero: answers

# (answer inside the tags, ground truth, correct?) -- each verified against math-verify 0.9.0.
R1_ANSWER_CASES = [
    ("0.5", "1/2", True),
    ("1/2", "0.5", True),
    (r"\frac{1}{2}", "0.5", True),
    (r" \frac12 ", r"\frac{1}{2}", True),
    (r"\dfrac{1}{2}", r"\frac{1}{2}", True),
    (r"\tfrac{1}{2}", "0.5", True),
    ("2/4", r"\frac{1}{2}", True),
    (r"\frac{1}{3}", "0.5", False),
    (r"\boxed{5}", "5", True),
    (r"The answer is \boxed{5}.", "5", True),
    (r"\boxed{1} no wait, \boxed{2}", "2", True),  # the last \boxed{} counts
    (r"\boxed{1} no wait, \boxed{2}", "1", False),
    ("The answer is 5.", "5", True),  # text around the answer
    ("The answer is 5.", "6", False),
    ("She sold 15 clips.", "72", False),  # seed 001's example
    ("72", "72", True),
    ("-3", "-3", True),
    ("3", "-3", False),
    ("-3", "3", False),
    (r"50\%", "50", True),
    ("1,000", "1000", True),
    ("1.0", "1", True),
    ("0.333333", r"\frac13", True),  # math-verify rounds to 6 decimals
    ("0.333", r"\frac13", False),
    (r"(1, 2]", "(1,2]", True),  # intervals
    ("(1,2)", "[1,2]", False),
    (r"(-\infty, 3)", r"(-\infty,3)", True),
    (r"[2, \infty)", r"[2,\infty)", True),
    (r"\{1,2,3\}", r"\{3,2,1\}", True),  # sets ignore order
    ("1, 2, 3", r"\{3,2,1\}", True),
    (r"\{1,2\}", r"\{1,2,3\}", False),
    ("(3, -1)", "(3,-1)", True),  # ordered pairs keep order
    ("(-1, 3)", "(3,-1)", False),
    ("x = 5", "5", True),
    (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}", True),
    (r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt2}{2}", True),
    ("4x+10", "4x + 10", True),  # seed 001's "<answer>4x + 10</answer>"
    ("10 + 4x", "4x+10", True),
    ("4x+11", "4x+10", False),
    ("x^2+2x+1", "(x+1)^2", True),
    (r"\pi", r"\pi", True),
    ("3.14159", r"\pi", False),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", True),
    (r"\text{(A)}", "A", True),
    (r"$\frac{3}{4}$", "0.75", True),  # an answer with its own $...$
    (r"\$5", "5", True),  # an escaped dollar is a currency sign, not a delimiter
    ("10^{3}", "1000", True),
    (r"90^\circ", "90", True),
    ("7", r"\boxed{7}", True),  # a boxed ground truth
    ("12", r"The total is $\boxed{12}$.", True),
    ("", "5", False),
    (r"\boxed{5", "5", False),  # unclosed \boxed{: no answer
]


@pytest.mark.parametrize("answer, gold, correct", R1_ANSWER_CASES)
def test_r1_zero_answers(answer, gold, correct):
    assert r1_zero_reward_fn(r1(answer), gold) == (RIGHT if correct else WRONG)


def test_r1_zero_ground_truth_types():
    assert r1_zero_reward_fn(r1("5"), ["4", "5"]) == RIGHT  # any acceptable answer
    assert r1_zero_reward_fn(r1("5"), ["4", "6"]) == WRONG
    assert r1_zero_reward_fn(r1("5"), 5) == RIGHT  # numbers are stringified
    assert r1_zero_reward_fn(r1("0.5"), 0.5) == RIGHT
    for bad in [None, [], "", "   ", [None], {"a": 1}, True]:
        assert r1_zero_reward_fn(r1("5"), bad) == WRONG


# --------------------------------------------------------------------------- r1_zero: format


@pytest.mark.parametrize(
    "response, expected",
    [
        ("</think> <answer>5</answer>", RIGHT),  # empty reasoning is allowed
        ("a </think> <answer>5</answer> trailing text", RIGHT),
        ("a </think> <answer>5</answer>", RIGHT),
        ("a </think><answer>5</answer>", ZEROS),  # exactly one space, as the seed grader checks
        ("a </think>\n<answer>5</answer>", ZEROS),
        ("a </think> <answer>5", ZEROS),  # no closing tag (e.g. stop string not kept)
        ("a <answer>5</answer>", ZEROS),
        ("a </answer> b </think> <answer>5", ZEROS),  # </answer> must come after the opening
        ("5", ZEROS),
        ("", ZEROS),
        ("a </think> <answer>6</answer>", WRONG),
        ("a </think> <answer></answer>", WRONG),
    ],
)
def test_r1_zero_format(response, expected):
    assert r1_zero_reward_fn(response, "5") == expected


def test_r1_zero_fast_false_is_lenient():
    # Prose that the strict $-wrapped reading cannot make sense of; the lenient mode reads 0.5.
    assert r1_zero_reward_fn(r1("approximately 0.5"), "0.5") == WRONG
    assert r1_zero_reward_fn(r1("approximately 0.5"), "0.5", fast=False) == RIGHT
    assert r1_zero_reward_fn(r1("0.75"), "0.5", fast=False) == WRONG


def test_r1_zero_explosive_answers_score_zero_quickly():
    # Screened out before sympy evaluates them (each would run for minutes or exhaust memory).
    for answer in ["9^{9^{9^{9}}}", "(x+1)^{3000}", "(2^{100})!", "10^{10^{10}} + 1", "(" * 30 + "1" + ")" * 30,
                   "1+" * 300 + "1"]:
        assert r1_zero_reward_fn(r1(answer), "5") == WRONG
    # Identical strings still match (math-verify's string comparison needs no sympy).
    assert r1_zero_reward_fn(r1("10^{10^{10}}"), "10^{10^{10}}") == RIGHT


@pytest.fixture(params=["child process", "in process"])
def grader_mode(request):
    rewards.configure_math_grader(isolated=request.param == "child process")
    yield request.param
    rewards.configure_math_grader(isolated=True)


@pytest.mark.parametrize("latex, kept", [
    ("9^{9^{9^{9}}}", False), ("10^{10^{5}}", False), ("(x+1)^{101}", False), ("(2^{100})!", False),
    ("100001!", False), (r"\int_0^1 x dx", False),
    ("2^{1000}", True), ("10^{9999}", True), ("(x+1)^{100}", True), ("x^{5000}", True), ("20!", True),
    (r"\frac{1}{2}", True), ("(1, 2]", True), (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", True),
])
def test_screening_drops_only_explosive_expressions(latex, kept):
    # Parsing never evaluates; the screen must drop the sympy reading of the explosive ones (their
    # plain-string reading stays: string comparison is cheap).
    readings = rewards._parse(f"${latex}$")
    assert readings and any(not isinstance(r, str) for r in readings) == kept


def test_grader_works_from_worker_threads(grader_mode):
    # math-verify's default signal.alarm timeouts raise off the main thread; in process, ours must
    # not use them, and the child-process grader must serve many threads.
    answers = ["1/2", "0.5", "3", r"\frac{1}{2}", r"\boxed{0.5}", "7"] * 3
    expected = [1.0, 1.0, 0.0, 1.0, 1.0, 0.0] * 3
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda a: r1_zero_reward_fn(r1(a), "1/2")["reward"], answers))
    assert got == expected
    box = {}
    t = threading.Thread(target=lambda: box.update(q=question_only_reward_fn("so it is 72", "72")))
    t.start()
    t.join()
    assert box["q"] == RIGHT


def test_in_process_grading_matches_the_child_process():
    sample = R1_ANSWER_CASES[::3]
    isolated = [r1_zero_reward_fn(r1(a), g) for a, g, _ in sample]
    try:
        rewards.configure_math_grader(isolated=False)
        local = [r1_zero_reward_fn(r1(a), g) for a, g, _ in sample]
    finally:
        rewards.configure_math_grader(isolated=True)
    assert local == isolated == [RIGHT if c else WRONG for _, _, c in sample]


def test_a_runaway_answer_is_killed_and_the_grader_recovers(caplog):
    # The child sleeps past the timeout (standing in for a sympy runaway); it is killed, scored 0,
    # and the next request starts a fresh child.
    grader = rewards._GRADER
    assert grader.request({"kind": "sleep", "text": "30", "golds": ["5"], "fast": True}, 0.5) is None
    assert grader.request({"kind": "answer", "text": "5", "golds": ["5"], "fast": True}, 60.0) == (True, True)
    try:
        rewards.configure_math_grader(timeout_s=1e-6)
        with caplog.at_level("WARNING", logger="rlpipe.tasks.math.grader"):
            # an answer no earlier test graded: the result cache must not answer for the child
            assert r1_zero_reward_fn(r1("\\frac{4321}{10000}"), "0.4321") == WRONG
        assert "scoring 0" in caplog.text
    finally:
        rewards.configure_math_grader(isolated=True, timeout_s=10.0)
    assert r1_zero_reward_fn(r1("5"), "5") == RIGHT
    with pytest.raises(ValueError, match="timeout_s"):
        rewards.configure_math_grader(timeout_s=0)


# --------------------------------------------------------------------------- question_only


@pytest.mark.parametrize(
    "response, gold, expected",
    [
        ("Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether.", "72", RIGHT),
        ("First 3+4=7. Then 7*2 = 14. So the answer is 14.", "14", RIGHT),
        ("First 3+4=7. Then 7*2 = 14. So the answer is 14.", "7", WRONG),
        (r"Therefore, the final answer is: $\boxed{12}$. I hope it is correct.", "12", RIGHT),
        (r"\boxed{5} hmm, no: \boxed{6}", "6", RIGHT),  # the last \boxed{}
        (r"\boxed{5} hmm, no: \boxed{6}", "5", WRONG),
        (r"We get \boxed{\frac{1}{2}}", "0.5", RIGHT),
        ("<think>easy</think> <answer>5</answer>", "5", RIGHT),  # tags do not hide the number
        ("x" * 100_000 + " so 5", "5", RIGHT),  # only the tail is read
        ("answer 5 " + "x" * 2000, "5", ZEROS),  # ... so an answer before it is not found
        ("no numbers here", "5", ZEROS),  # nothing read: format 0
        ("", "5", ZEROS),
        (r"\boxed{5", "5", ZEROS),  # unclosed \boxed{
        (r"\boxed{}", "5", ZEROS),
        ("The answer is 5.", ["4", "5"], RIGHT),
    ],
)
def test_question_only(response, gold, expected):
    assert question_only_reward_fn(response, gold) == expected


# --------------------------------------------------------------------------- never raise


@pytest.mark.parametrize("fn", [r1_zero_reward_fn, question_only_reward_fn, keyword_inclusion_reward_fn])
@pytest.mark.parametrize("response", [None, 5, b"bytes", ["list"], "\ud800 lone surrogate", "\x00" * 10,
                                      "{" * 5000, r"\boxed{" * 1000, "</think> <answer>" + "}" * 10_000 + "</answer>",
                                      "</think> <answer>" + "x" * 3_000_000 + "</answer>"])
def test_never_raises(fn, response):
    out = fn(response, "5")
    assert set(out) == KEYS and all(v in (0.0, 1.0) for v in out.values())


# --------------------------------------------------------------------------- sorting (seed 003)

SEED_PROMPT = [3, 1, 0, 2]


@pytest.mark.parametrize(
    "response, distance, inclusion_ordering",
    [
        # Seed 003's simple_task() examples, by hand. Ground truth sorted(prompt) = [0, 1, 2, 3].
        ([0, 1, 2, 3], 4.0, 7.0),  # 4 positions; inclusion 4 + ordering 3
        ([7, 2, 2, 5], 1.0, 3.0),  # position 2 only; inclusion {2} = 1 + pairs 2<=2, 2<=5 = 2
        ([0, 3, 1, 2], 1.0, 6.0),  # position 0 only; inclusion 4 + pairs 0<=3, 1<=2 = 2
    ],
)
def test_seed_003_sort_rewards(response, distance, inclusion_ordering):
    assert sort_distance_reward(SEED_PROMPT, response) == distance
    assert sort_inclusion_ordering_reward(SEED_PROMPT, response) == inclusion_ordering
    # Tensors (seed 003's compute_reward passes tensor rows) give the same numbers.
    assert sort_inclusion_ordering_reward(torch.tensor(SEED_PROMPT), torch.tensor(response)) == inclusion_ordering
    # The dict wrappers divide by the maxima n = 4 and 2n - 1 = 7.
    assert sort_distance_reward_fn(response, SEED_PROMPT)["reward"] == distance / 4
    text = " ".join(map(str, response))
    assert sort_inclusion_ordering_reward_fn(text, SEED_PROMPT)["reward"] == inclusion_ordering / 7


def test_seed_sort_rewards_keep_duplicates_semantics_and_check_lengths():
    # Duplicates in the prompt each earn inclusion if the value appears at all (seed's `x in response`).
    assert sort_inclusion_ordering_reward([2, 2], [2, 5]) == 2 + 1
    with pytest.raises(ValueError, match="lengths differ"):
        sort_distance_reward([1, 2], [1])
    with pytest.raises(ValueError, match="lengths differ"):
        sort_inclusion_ordering_reward([1, 2], [1, 2, 3])


@pytest.mark.parametrize(
    "response, dist, incl, fmt, ans",
    [
        ("0 1 2 3", 1.0, 1.0, 1.0, 1.0),
        ("Sorted: 0, 1, 2, 3\n", 1.0, 1.0, 1.0, 1.0),
        ("0 3 1 2", 1 / 4, 6 / 7, 1.0, 0.0),
        ("0 1 2", 3 / 4, 5 / 7, 0.0, 0.0),  # short: inclusion {0,1,2} = 3 + 2 pairs; no padding
        ("0 1 2 3 9", 1.0, 1.0, 0.0, 0.0),  # long: first n scored, format 0
        ("", 0.0, 0.0, 0.0, 0.0),  # empty earns nothing (padding would give free ordering points)
        ("no digits", 0.0, 0.0, 0.0, 0.0),
        ([0, 1, 2, 3], 1.0, 1.0, 1.0, 1.0),
        (torch.tensor([0, 3, 1, 2]), 1 / 4, 6 / 7, 1.0, 0.0),
    ],
)
def test_sort_reward_fns(response, dist, incl, fmt, ans):
    d = sort_distance_reward_fn(response, SEED_PROMPT)
    i = sort_inclusion_ordering_reward_fn(response, SEED_PROMPT)
    assert d["reward"] == pytest.approx(dist) and i["reward"] == pytest.approx(incl)
    assert d["format_reward"] == i["format_reward"] == fmt
    assert d["answer_reward"] == i["answer_reward"] == ans


@pytest.mark.parametrize("response, prompt", [(None, SEED_PROMPT), ("1", None), ("1", []), ("1", "3 1"),
                                              ([0.5, 1, 2, 3], SEED_PROMPT), ([True] * 4, SEED_PROMPT),
                                              ("9" * 100, SEED_PROMPT), ({1: 2}, SEED_PROMPT)])
def test_sort_reward_fns_never_raise(response, prompt):
    assert sort_distance_reward_fn(response, prompt) == ZEROS
    assert sort_inclusion_ordering_reward_fn(response, prompt) == ZEROS


def test_last_boxed():
    assert last_boxed(r"a \boxed{1} b \boxed{\frac{1}{2}} c") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{\{1,2\}}") == r"\{1,2\}"  # escaped set braces do not count
    assert last_boxed(r"\boxed{1") is None and last_boxed("none") is None
