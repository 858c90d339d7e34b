"""``rlpipe math-report`` (rlpipe.analysis.math_report) on hand-made eval directories and runs.

Two evals (``base``: 10 examples, 5 correct, 2 well-formed but wrong, 3 unparsable; ``onpolicy
(final)``: 4 examples, all correct) and two runs: ``onpolicy`` with the format/answer columns
(validation answer reward 0.2, 0.5, 0.4 at steps 0, 2, 4) and ``legacy``, written before those
columns existed (only ``reward/val_mean`` 0.1, 0.3 at steps 0, 4 and ``reward/train_mean``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from rlpipe import contract
from rlpipe.analysis import math_report
from rlpipe.contract import (
    EVAL_CATEGORIES,
    EVAL_COLUMNS,
    EVAL_FILES,
    EVAL_SUMMARY_KEYS,
    MATH_JSON_KEYS,
    MATH_REPORT_FILES,
    METRICS_FILE,
)

ROOT = Path(__file__).resolve().parents[1]
LONG = "x" * 5000
BASE_ROWS = (  # (response, format, answer)
    [("think </think> <answer>3</answer>", 1.0, 1.0)] * 5 + [("</think> <answer>4</answer>", 1.0, 0.0)] * 2
    + [("<b>no tags</b> " + LONG, 0.0, 0.0)] * 3
)
NAN = math.nan


def _write_eval(d: Path, rows: list[tuple[str, float, float]]) -> Path:
    d.mkdir(parents=True)
    cat = {pair: name for name, pair in EVAL_CATEGORIES.items()}
    frame = pd.DataFrame(
        [(i, f"Question {i}: what is 1+2?\nAssistant: <think>", r, "3", f, a, a, cat[(int(f), int(a))], "stop")
         for i, (r, f, a) in enumerate(rows)], columns=list(EVAL_COLUMNS))
    frame.to_parquet(d / EVAL_FILES["examples"], index=False)
    counts = {c: int((frame["category"] == c).sum()) for c in EVAL_CATEGORIES}
    meta = {"n": len(rows), "accuracy": float(frame["answer_reward"].mean()),
            "format_rate": float(frame["format_reward"].mean()), "reward_mean": float(frame["reward"].mean()),
            "categories": counts, "reward_errors": 0, "checkpoint": str(d / "model.pt"), "dataset": "math",
            "prompt": "r1_zero", "max_tokens": 64, "temperature": 1.0, "top_p": 1.0, "seed": 1,
            "wall_time_s": 2.0, "tokens_generated": 100}
    assert tuple(meta) == EVAL_SUMMARY_KEYS
    (d / EVAL_FILES["summary"]).write_text(json.dumps(meta))
    return d


def _write_run(d: Path, columns: dict[str, list[float]]) -> Path:
    d.mkdir(parents=True)
    steps = list(range(5))
    frame = pd.DataFrame({"step": steps, "wall_time": [10.0 * s for s in steps], **columns})
    frame.to_parquet(d / METRICS_FILE, index=False)
    return d


@pytest.fixture
def inputs(tmp_path):
    base = _write_eval(tmp_path / "eval_base", BASE_ROWS)
    final = _write_eval(tmp_path / "eval_final", [("</think> <answer>3</answer>", 1.0, 1.0)] * 4)
    onpolicy = _write_run(tmp_path / "onpolicy", {
        "reward/train_mean": [NAN, 0.1, 0.2, 0.3, 0.4], "reward/val_mean": [0.2, NAN, 0.5, NAN, 0.4],
        "reward/format_mean": [NAN, 0.5, 0.6, 0.8, 0.9], "reward/answer_mean": [NAN, 0.1, 0.2, 0.3, 0.4],
        "reward/val_format_mean": [0.4, NAN, 0.8, NAN, 0.9], "reward/val_answer_mean": [0.2, NAN, 0.5, NAN, 0.4]})
    legacy = _write_run(tmp_path / "legacy", {
        "reward/train_mean": [NAN, 0.1, 0.1, 0.2, 0.2], "reward/val_mean": [0.1, NAN, NAN, NAN, 0.3]})
    return base, final, onpolicy, legacy


def _main(tmp_path, base, final, onpolicy, legacy):
    return math_report.main(["--evals", str(base), str(final), "--labels", "base", "onpolicy (final)",
                             "--runs", str(onpolicy), str(legacy), "--run-labels", "onpolicy", "legacy",
                             "--out", str(tmp_path / "report")])


def test_builds_the_three_files(tmp_path, inputs):
    assert _main(tmp_path, *inputs) == 0
    out = tmp_path / "report"
    assert sorted(p.name for p in out.iterdir()) == sorted(MATH_REPORT_FILES.values())
    assert (out / MATH_REPORT_FILES["learning_png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_math_json_numbers(tmp_path, inputs):
    _main(tmp_path, *inputs)
    m = json.loads((tmp_path / "report" / MATH_REPORT_FILES["math_json"]).read_text())
    assert tuple(m) == MATH_JSON_KEYS
    assert m["base"] == {"n": 10, "accuracy": 0.5, "format_rate": 0.7,
                         "categories": {"format1_answer1": 5, "format1_answer0": 2, "format0_answer0": 3,
                                        "format0_answer1": 0}}
    assert set(m["evals"]) == {"base", "onpolicy (final)"}
    on = m["runs"]["onpolicy"]
    assert on["val_column"] == "reward/val_answer_mean"
    assert [(p["step"], p["wall_time_s"], p["val_answer"], p["val_format"]) for p in on["val_points"]] == [
        (0, 0.0, 0.2, 0.4), (2, 20.0, 0.5, 0.8), (4, 40.0, 0.4, 0.9)]
    assert (on["initial_val_answer"], on["final_val_answer"], on["best_val_answer"], on["best_step"]) == (
        0.2, 0.4, 0.5, 2)
    assert on["rise"] == pytest.approx(0.2)
    assert (on["final_step"], on["final_wall_time_s"]) == (4, 40.0)
    assert (on["final_eval"], on["final_eval_accuracy"]) == ("onpolicy (final)", 1.0)
    legacy = m["runs"]["legacy"]
    assert legacy["val_column"] == "reward/val_mean"  # the fallback
    assert (legacy["initial_val_answer"], legacy["final_val_answer"]) == (0.1, 0.3)
    assert legacy["rise"] == pytest.approx(0.2)
    assert legacy["val_points"][0]["val_format"] is None
    assert legacy["final_eval_accuracy"] is None
    notes = " | ".join(m["notes"])
    assert "legacy" in notes and "reward/val_answer_mean missing, used reward/val_mean" in notes
    assert "legacy: no reward/format_mean" in notes  # the format panel says what it lacks


def test_eval_html_tables_and_examples(tmp_path, inputs, monkeypatch):
    assert math_report.EXAMPLES_PER_CATEGORY >= 10  # seed 001 Problem 1(b): at least 10 cases
    monkeypatch.setattr(math_report, "EXAMPLES_PER_CATEGORY", 3)  # the fixture has 5 per category
    _main(tmp_path, *inputs)
    page = (tmp_path / "report" / MATH_REPORT_FILES["eval_html"]).read_text()
    assert page.count("<h2>") == 2 and "onpolicy (final)" in page
    for c in ("format1_answer1", "format1_answer0", "format0_answer0"):
        assert math_report.CATEGORY_TEXT[c] in page
    assert math_report.CATEGORY_TEXT["format0_answer1"] not in page  # never occurred: not shown
    assert f"{math_report.CATEGORY_TEXT['format1_answer1']} (3 of 5 shown)" in page  # capped at 3 examples
    base_part = page.split("<h2>")[1]
    assert base_part.count("&lt;answer&gt;3&lt;/answer&gt;") == 3
    assert "<b>no tags</b>" not in page and "&lt;b&gt;no tags&lt;/b&gt;" in page  # escaped
    assert LONG not in page and re.search(r"\[\.\.\. \d+ chars\]", page)  # truncated
    assert "5 (50.0%)" in page and "0.500" in page


def test_category_text_covers_the_contract():
    assert set(math_report.CATEGORY_TEXT) == set(EVAL_CATEGORIES)
    assert set(math_report.OPTIONAL_CATEGORIES) <= set(EVAL_CATEGORIES)


def test_panel_columns_are_metric_columns():
    """Every metrics.parquet column learning.png reads (and its fallbacks) is a declared one."""
    fallbacks = {c for *_, fb in math_report.PANELS if fb for c in fb}
    assert fallbacks <= set(contract.METRIC_COLUMNS)
    primary = {c for _, train, val, _ in math_report.PANELS for c in (train, val)}
    assert primary <= set(contract.METRIC_COLUMNS), primary - set(contract.METRIC_COLUMNS)


def test_runs_without_any_validation_column_still_draw(tmp_path, inputs):
    base, final, _, _ = inputs
    bare = _write_run(tmp_path / "bare", {"loss/policy": [NAN, 1.0, 0.9, 0.8, 0.7]})
    assert math_report.main(["--evals", str(base), "--labels", "base", "--runs", str(bare), "--run-labels", "bare",
                             "--out", str(tmp_path / "r")]) == 0
    m = json.loads((tmp_path / "r" / MATH_REPORT_FILES["math_json"]).read_text())
    assert m["runs"]["bare"]["val_column"] is None and m["runs"]["bare"]["final_val_answer"] is None
    assert any("no validation reward column" in n for n in m["notes"])


@pytest.mark.parametrize("case", ["label count", "missing summary", "missing metrics", "summary key"])
def test_bad_inputs_are_refused_before_writing(tmp_path, inputs, capsys, case):
    base, final, onpolicy, _ = inputs
    evals, labels, runs = [str(base), str(final)], ["base", "final"], [str(onpolicy)]
    expected = "2 eval directories but 1 labels"
    if case == "label count":
        labels = ["base"]
    elif case == "missing summary":
        (final / EVAL_FILES["summary"]).unlink()
        expected = str(final / EVAL_FILES["summary"])
    elif case == "missing metrics":
        runs = [str(tmp_path / "nowhere")]
        expected = str(tmp_path / "nowhere" / METRICS_FILE)
    else:
        summary = json.loads((base / EVAL_FILES["summary"]).read_text())
        del summary["accuracy"]
        (base / EVAL_FILES["summary"]).write_text(json.dumps(summary))
        expected = "lacks keys ['accuracy']"
    with pytest.raises(SystemExit) as exc:
        math_report.main(["--evals", *evals, "--labels", *labels, "--runs", *runs, "--run-labels", "onpolicy",
                          "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("caption", ["math_eval.rst", "math_learning.rst"])
def test_captions_exist(caption):
    assert (ROOT / "workflow" / "report" / caption).read_text().strip()
