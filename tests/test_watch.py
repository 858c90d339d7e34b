"""``python -m rlpipe.watch``: a workflow job's command writes everything to its log, the console
gets a line at least every few seconds (the last line the command wrote: a training job's step
and ETA), and the exit status is the command's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlpipe import watch

STEPS = "import time\nfor i in range(1, 4):\n    print(f'[k4] step {{i}}/3 | ETA 0:0{{3 - i}}', flush=True)\n" \
        "    time.sleep(0.45)\nraise SystemExit({rc})\n"


@pytest.mark.parametrize("rc", [0, 3])
def test_heartbeats_show_the_last_step_line_and_the_exit_status_is_the_commands(tmp_path, rc):
    lines: list[str] = []
    log = tmp_path / "logs" / "k4.log"
    got = watch.run(log, "train k4", [sys.executable, "-c", STEPS.format(rc=rc)], every_s=0.3, emit=lines.append)
    assert got == rc
    assert log.read_text().splitlines() == [f"[k4] step {i}/3 | ETA 0:0{3 - i}" for i in (1, 2, 3)]
    beats = lines[:-1]
    assert len(beats) >= 2 and all(b.startswith("[train k4] 0:0") and " elapsed | " in b for b in beats)
    assert any(b.endswith("| [k4] step 2/3 | ETA 0:01") for b in beats), beats  # the running step and its ETA
    assert lines[-1].startswith("[train k4] done in" if rc == 0 else f"[train k4] failed (exit {rc})")


def test_a_silent_command_still_gets_heartbeats_and_tqdm_bars_are_read_to_their_last_update(tmp_path):
    lines: list[str] = []
    log = tmp_path / "p.log"
    bar = ("import sys, time\ntime.sleep(0.7)\nsys.stderr.write('pretrain 10%\\rpretrain 40%\\r')\n"
           "sys.stderr.flush()\ntime.sleep(0.7)\n")
    assert watch.run(log, "pretrain", [sys.executable, "-c", bar], every_s=0.3, emit=lines.append) == 0
    assert lines[0].endswith("| (no output yet)")
    assert any(x.endswith("| pretrain 40%") for x in lines)


def test_the_module_runs_from_the_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rlpipe.watch", str(tmp_path / "x.log"), "t", "--",
                           sys.executable, "-c", "print('hi'); raise SystemExit(5)"], capture_output=True, text=True)
    assert proc.returncode == 5 and (tmp_path / "x.log").read_text() == "hi\n"
    assert "[t] failed (exit 5)" in proc.stderr
    bad = subprocess.run([sys.executable, "-m", "rlpipe.watch", "x.log"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_the_latest_step_line_wins_over_later_noise(tmp_path):
    log = tmp_path / "t.log"
    log.write_text("[k4] step 3/10 (30%) | ETA 0:40\n[generator] v3 -> v4 at 12.3s\n2026 WARNING ray: something\n")
    assert watch.last_line(log) == "[k4] step 3/10 (30%) | ETA 0:40"
    log.write_text("starting Ray\n2026 WARNING ray: something\n")
    assert watch.last_line(log) == "2026 WARNING ray: something"


def test_format_elapsed():
    assert [watch.format_elapsed(s) for s in (0, 65.9, 3725)] == ["0:00", "1:05", "1:02:05"]


def test_the_pipelines_long_jobs_are_watched():
    """The test gate, pretraining, every training job and the benchmarks run under the watch, so
    the console is never silent for long (no `> {log} 2>&1` left on them)."""
    rules = Path(__file__).resolve().parents[1] / "workflow" / "rules"
    text = "".join((rules / f).read_text() for f in ("setup.smk", "data.smk", "tracks.smk", "families.smk",
                                                     "bench.smk", "aggregate.smk"))
    for rule in ("run_unit_tests", "pretrain_base", "train_variant", "train_family_run", "bench_weight_sync",
                 "bench_sampler", "bench_update", "bench_scaling", "bench_trl", "build_corpus", "train_tokenizer",
                 "evaluate_base", "evaluate_model", "build_math_data", "run_toy_sort", "report_family",
                 "aggregate_metrics", "write_results_page"):
        body = text.split(f"rule {rule}:")[1].split("\nrule ")[0].split("\n\n\n")[0]
        shell = body.split("shell:")[1]
        assert re.search(r"python -m rlpipe.watch (\{log\}|\"\$log\") ", shell), rule  # every long job
        assert not re.search(r"> \"?(\{log\}|\$log)", shell), rule
