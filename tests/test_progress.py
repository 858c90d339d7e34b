"""Live progress lines of ``rlpipe train``: formatting (pure) and the printing rules."""

from __future__ import annotations

import math

import pytest

from rlpipe.trainer.drivers.progress import (
    ProgressPrinter,
    StepProgress,
    due,
    eta_seconds,
    format_duration,
    format_progress,
    format_version_change,
)


def test_step_line_shows_every_field():
    line = format_progress(StepProgress("onpolicy", 12, 100, train_reward=0.375, val_reward=1 / 3, kl_ref=0.01234,
                                        samples_per_s=85.27, elapsed_s=42.4, eta_s=308.0))
    assert line == ("[onpolicy] step 12/100 (12%) | reward 0.375 | val 0.333 | kl_ref 0.0123 | 85.3 samples/s"
                    " | 0:42 elapsed | ETA 5:08")


def test_unmeasured_fields_are_left_out():
    line = format_progress(StepProgress("disagg", 0, 6, train_reward=math.nan, val_reward=0.5, kl_ref=None,
                                        samples_per_s=math.nan, elapsed_s=0.0, eta_s=None))
    assert line == "[disagg] step 0/6 (0%) | val 0.500 | 0:00 elapsed"


@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (59.6, "1:00"), (65, "1:05"), (3725, "1:02:05")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_version_line():
    assert format_version_change("generator", 3, 4, 12.34) == "[generator] v3 -> v4 at 12.3s"


def test_eta_uses_the_steps_since_this_process_started():
    # resumed at step 10 (wall 50 s); 5 more steps took 20 s -> 4 s per step, 85 left
    assert eta_seconds(70.0, 15, 50.0, 10, 100) == pytest.approx(340.0)
    assert eta_seconds(50.0, 10, 50.0, 10, 100) is None


def test_due_throttles_unforced_lines():
    assert due(5.0, None, 1.0, forced=False)
    assert not due(5.5, 5.0, 1.0, forced=False)
    assert due(5.5, 5.0, 1.0, forced=True)
    assert due(6.0, 5.0, 1.0, forced=False)


def test_printer_one_line_per_step_thinned_when_fast_and_versions_since_last_shown():
    lines: list[str] = []
    p = ProgressPrinter("v", total=4, versions=True, min_interval_s=1.0, emit=lines.append)
    nan = math.nan
    rows = [{"step": s, "wall_time": w, "reward/train_mean": 0.5, "reward/val_mean": v, "kl/ref_k3": 0.1,
             "perf/samples_per_s": 8.0} for s, w, v in [(1, 2.0, nan), (2, 2.5, nan), (3, 4.0, nan), (4, 4.2, nan)]]
    for r in rows:
        p.step(r)
    heads = [line.split(" | ")[0] for line in lines]
    assert heads == ["[v] step 1/4 (25%)", "[v] step 3/4 (75%)", "[v] step 4/4 (100%)"]
    assert lines[1].endswith("ETA 0:01")  # 4 s for 3 steps since the start (step 0, 0 s), 1 step left
    lines.clear()
    for v, w in [(1, 2.0), (2, 2.5), (3, 4.0)]:
        p.version("generator", v, w)
    assert lines == ["[generator] v0 -> v1 at 2.0s", "[generator] v1 -> v3 at 4.0s"]
    quiet: list[str] = []
    q = ProgressPrinter("v", total=4, versions=False, emit=quiet.append)
    q.version("learner", 1, 1.0)
    assert quiet == []
