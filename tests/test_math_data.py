"""MATH / GSM8K data (rlpipe.tasks.math.data) and the ``math`` task plug-in (rlpipe.tasks.math.task),
on the handwritten fixture ``tests/data/math_fixture.jsonl`` (20 problems of our own, MATH fields)
and small files written here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlpipe.tasks.base import Task
from rlpipe.tasks.math.data import MathDataError, final_answer, load_math_jsonl
from rlpipe.tasks.math.prompt import PROMPT_NAMES, format_math_prompt
from rlpipe.tasks.math.reward import question_only_reward_fn, r1_zero_reward_fn
from rlpipe.tasks.math.task import PROMPT_SETUPS, MathTask

FIXTURE = Path(__file__).parent / "data" / "math_fixture.jsonl"
RIGHT = {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}
WRONG = {"reward": 0.0, "format_reward": 1.0, "answer_reward": 0.0}

# the fixture's ground truths, by hand: rows 10-13 have only a solution (their last \boxed{})
EXPECTED_TRUTHS = [
    "23", r"\frac{3}{4}", "0.1", r"5\sqrt{2}", r"(4,\infty)", "[-3,3]", "-5", r"12.5\%", r"\text{B,D}", "(1,2)",
    r"\frac{1}{6}", r"\frac{\sqrt{3}}{2}", "6", "2",
    r"\varnothing", r"9\pi", r"\dfrac{5}{6}", "10,000", "x^2+2x+1", r"\text{Thursday}",
]


def records() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def r1(answer: str) -> str:
    return f"Let me think. </think> <answer>{answer}</answer>"


# --------------------------------------------------------------------------- loading


def test_fixture_loads_with_r1_zero_prompts():
    examples = load_math_jsonl(FIXTURE)
    assert [e.ground_truth for e in examples] == EXPECTED_TRUTHS
    for example, record in zip(examples, records(), strict=True):
        assert example.prompt == format_math_prompt("r1_zero", record["problem"])
        assert example.prompt.endswith("Assistant: <think>") and record["problem"] in example.prompt


def test_question_only_prompt_and_limit():
    examples = load_math_jsonl(FIXTURE, "question_only", limit=3)
    assert [e.prompt for e in examples] == [r["problem"] for r in records()[:3]]
    with pytest.raises(ValueError, match="limit"):
        load_math_jsonl(FIXTURE, limit=0)


def test_fixture_answers_grade_right_and_agree_with_their_solutions():
    """Every ground truth is graded right against itself, and where a record has both a short
    answer and a solution, the solution's boxed answer grades right against the short answer (a
    typo in the fixture would show here); a neighbour's answer grades wrong."""
    examples = load_math_jsonl(FIXTURE)
    for i, (example, record) in enumerate(zip(examples, records(), strict=True)):
        truth = example.ground_truth
        assert r1_zero_reward_fn(r1(truth), truth) == RIGHT, truth
        if "answer" in record:
            assert r1_zero_reward_fn(r1(final_answer(record["solution"])), truth) == RIGHT, record["solution"]
        other = examples[(i + 1) % len(examples)].ground_truth
        assert r1_zero_reward_fn(r1(other), truth) == WRONG, (other, truth)


def test_solution_only_uses_the_last_box_even_with_an_answer_field_empty(tmp_path):
    rows = [{"problem": "p1", "solution": r"First $\boxed{3}$, then really $\boxed{\frac{1}{2}}$."},
            {"problem": "p2", "answer": "", "solution": r"So $\boxed{\{1,2\}}$."},  # empty answer: use the solution
            {"problem": "p3", "answer": 7, "solution": "ignored"},  # numbers are stringified
            {"problem": "p4", "answer": r"Worked: $\boxed{4}$"}]  # a worked answer is reduced to its box
    examples = load_math_jsonl(write_jsonl(tmp_path / "m.jsonl", rows))
    assert [e.ground_truth for e in examples] == [r"\frac{1}{2}", r"\{1,2\}", "7", "4"]


def test_gsm8k_style(tmp_path):
    rows = [{"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
                         "in May. How many clips did Natalia sell altogether in April and May?",
             "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 "
                       "clips altogether in April and May.\n#### 72"},
            {"question": "How much is 40 times 40?", "answer": "40 * 40 = 1600\n#### 1,600"}]
    examples = load_math_jsonl(write_jsonl(tmp_path / "gsm8k.jsonl", rows), problem_field="question")
    assert [e.ground_truth for e in examples] == ["72", "1600"]
    assert examples[0].prompt == format_math_prompt("r1_zero", rows[0]["question"])
    assert r1_zero_reward_fn(r1("72"), examples[0].ground_truth) == RIGHT


def test_custom_field_names(tmp_path):
    rows = [{"q": "What is 1+1?", "a": "2", "sol": r"\boxed{3}"}, {"q": "What is 2+2?", "sol": r"so \boxed{4}"}]
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    got = load_math_jsonl(path, problem_field="q", answer_field="a", solution_field="sol")
    assert [e.ground_truth for e in got] == ["2", "4"]
    got = load_math_jsonl(path, problem_field="q", answer_field=None, solution_field="sol")  # answers ignored
    assert [e.ground_truth for e in got] == ["3", "4"]


@pytest.mark.parametrize("solution, truth", [
    (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
    (r"\boxed{1} and then \boxed{\{1, 2\}}", r"\{1, 2\}"),
    ("2 + 2 = <<2+2=4>>4\n#### 4", "4"),
    ("#### 12,345,678", "12345678"),
    (r"\boxed{5} #### 6", "5"),  # a box wins over ####
    (r"an unclosed \boxed{5 #### 6", "6"),
    ("no final answer", None),
    (r"\boxed{5", None),
])
def test_final_answer(solution, truth):
    assert final_answer(solution) == truth


# --------------------------------------------------------------------------- errors


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_math_jsonl(tmp_path / "nope.jsonl")


def test_unknown_prompt_fails_before_reading(tmp_path):
    with pytest.raises(ValueError, match="'r2_zero'"):
        load_math_jsonl(tmp_path / "nope.jsonl", "r2_zero")


@pytest.mark.parametrize("rows, match", [
    ([{"problem": "ok", "answer": "1"}, "", '{"problem": "broken", "answer": '], r"m\.jsonl:3: malformed JSON"),
    ([{"problem": "ok", "answer": "1"}, '["a", "list"]'], r"m\.jsonl:2: expected a JSON object, got list"),
    ([{"question": "q", "answer": "1"}], r"m\.jsonl:1: problem field 'problem' is missing; "
                                         r"the record's fields are \['answer', 'question'\]"),
    ([{"problem": "", "answer": "1"}], r"m\.jsonl:1: problem field 'problem' is not a non-empty string"),
    ([{"problem": "p", "answer": "1"}, {"problem": "p", "level": 3}],
     r"m\.jsonl:2: no ground truth: the record has no non-empty 'answer' or 'solution' field; "
     r"its fields are \['level', 'problem'\]"),
    ([{"problem": "p", "solution": "It is five."}],
     r"m\.jsonl:1: no ground truth: field 'solution' has no closed \\boxed"),
    ([{"problem": "p", "solution": r"So \boxed{}."}], r"m\.jsonl:1: the final answer '' taken from field 'solution'"),
    ([{"problem": "p", "solution": r"So \boxed{\frac{}{}}."}], r"m\.jsonl:1: the final answer '\\\\frac\{\}\{\}' "
                                                            r"taken from field 'solution' does not parse"),
    ([{"problem": "p", "solution": r"So \boxed{5."}], r"m\.jsonl:1: no ground truth: .*no closed \\boxed"),
    ([{"problem": "p", "answer": ["1", "2"]}], r"m\.jsonl:1: field 'answer' must be a string or a number, got list"),
    ([], r"m\.jsonl holds no records"),
])
def test_errors_name_file_line_and_field(tmp_path, rows, match):
    with pytest.raises(MathDataError, match=match):
        load_math_jsonl(write_jsonl(tmp_path / "m.jsonl", rows))


# --------------------------------------------------------------------------- the task plug-in


@pytest.fixture
def dataset(tmp_path) -> Path:
    lines = FIXTURE.read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "train.jsonl").write_text("".join(lines[:14]), encoding="utf-8")
    (tmp_path / "validation.jsonl").write_text("".join(lines[14:]), encoding="utf-8")
    return tmp_path


def test_math_task_r1_zero(dataset):
    task = MathTask(dataset)
    assert isinstance(task, Task) and task.name == "math"
    assert task.stop == ("</answer>",) and task.include_stop_str_in_output
    assert [e.ground_truth for e in task.train_examples()] == EXPECTED_TRUTHS[:14]
    assert [e.ground_truth for e in task.val_examples()] == EXPECTED_TRUTHS[14:]
    assert task.reward(r1(r"\emptyset"), task.val_examples()[0].ground_truth) == RIGHT  # \varnothing gold
    assert task.reward(r"\boxed{23}", "23")["format_reward"] == 0.0  # r1_zero wants the tags
    batch = task.prompts_for_batch(0, 4, seed=0)
    assert len(batch) == 4 and all(e in task.train_examples() for e in batch)


def test_math_task_question_only_and_strict(dataset):
    task = MathTask(dataset, "question_only", strict=True)
    assert task.stop == () and task.train_examples()[0].prompt == records()[0]["problem"]
    assert task.reward(r"so \boxed{23}", "23") == question_only_reward_fn(r"so \boxed{23}", "23") == RIGHT
    assert task.reward(r"so \boxed{\frac{36}{48}}", r"\frac{3}{4}") == WRONG  # strict: not simplified
    assert MathTask(dataset, "question_only").reward(r"so \boxed{\frac{36}{48}}", r"\frac{3}{4}") == RIGHT


def test_every_prompt_has_a_reward_and_stop_strings():
    assert set(PROMPT_SETUPS) == set(PROMPT_NAMES)
    assert PROMPT_SETUPS["r1_zero"][0] is r1_zero_reward_fn


def test_math_task_errors(tmp_path, dataset):
    with pytest.raises(ValueError, match="dataset directory"):
        MathTask(None)
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        MathTask(tmp_path / "missing_dir")
    with pytest.raises(ValueError, match="'r2_zero'"):
        MathTask(dataset, "r2_zero")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"lacks train\.jsonl and val\.jsonl or validation\.jsonl"):
        MathTask(empty)
    shutil.copy(FIXTURE, empty / "train.jsonl")
    (empty / "test.jsonl").write_text('{"problem": "p"}\n')
    with pytest.raises(MathDataError, match=r"test\.jsonl:1: no ground truth"):
        MathTask(empty)
