"""The watchdog that stops a killed driver's Ray session: which processes it matches, and that it
reaps one session's processes when its driver dies (and nothing when the driver stops it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlpipe.trainer.ray_reaper import ProcInfo, read_proc, session_pids

SD = "/tmp/ray/session_2026-11-25_19-38-58_802156_9046"
OTHER = "/tmp/ray/session_2026-11-25_19-38-58_802156_90461"  # same start, a pid with one more digit


def test_session_pids_matches_by_command_line_or_open_file_in_that_session_only():
    procs = [
        ProcInfo(10, ("gcs_server", f"--log_dir={SD}/logs", f"--session-name={Path(SD).name}")),
        ProcInfo(11, ("raylet", f"--raylet_socket_name={SD}/sockets/raylet")),
        ProcInfo(12, ("ray::DashboardAgent",), ("/dev/null", f"{SD}/logs/raylet.err", "socket:[123]")),
        ProcInfo(13, ("ray::Learner",), (f"{SD}/logs/worker-ab-ffffffff-13.out",)),
        ProcInfo(20, ("gcs_server", f"--log_dir={OTHER}/logs", f"--session-name={Path(OTHER).name}")),
        ProcInfo(21, ("ray::DashboardAgent",), (f"{OTHER}/logs/raylet.err",)),
        ProcInfo(22, ("ray::Other",), (f"{SD}_old/logs/x.out", "/tmp/ray/session_latest/logs/x.out")),
        ProcInfo(23, ("python", "train.py"), ("/tmp/ray/session_latest",)),
        ProcInfo(24, (), ()),  # a zombie: no command line, no files
        ProcInfo(30, ("python", "-m", "rlpipe.trainer.ray_reaper", "--session", SD)),
    ]
    assert session_pids(procs, SD, exclude=[30]) == [10, 11, 12, 13]
    assert session_pids(procs, SD + "/", exclude=[30]) == [10, 11, 12, 13]
    assert session_pids(procs, OTHER) == [20, 21]


def test_read_proc_sees_this_process_and_its_open_files(tmp_path):
    with open(tmp_path / "held.log", "w"):
        me = read_proc(os.getpid())
        assert me is not None and me.pid == os.getpid() and me.cmdline
        assert str(tmp_path / "held.log") in me.open_paths
        assert session_pids([me], str(tmp_path)) == [os.getpid()]
    assert read_proc(2**22 + 7) is None  # above pid_max: no such process


def _holder(session_dir: Path) -> subprocess.Popen:
    """A process of the fake session: renamed like Ray's agents (nothing of the session in its command
    line), its stdout a log file in the session directory."""
    (session_dir / "logs").mkdir(parents=True, exist_ok=True)
    with open(session_dir / "logs" / "agent.out", "w") as log:
        return subprocess.Popen(["sleep", "120"], stdout=log, start_new_session=True)


def _driver(session_dir: Path, then: str) -> subprocess.Popen:
    code = ("import sys, time; from rlpipe.trainer import ray_reaper; "
            f"w = ray_reaper.start({str(session_dir)!r}); print(w.pid, flush=True); {then}")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def _gone(p: subprocess.Popen, within: float) -> bool:
    deadline = time.time() + within
    while p.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    return p.poll() is not None


def test_a_killed_driver_s_session_is_reaped_and_no_other(tmp_path):
    mine, theirs = tmp_path / "session_2026-01-01_00-00-00_000001_1", tmp_path / "session_2026-01-01_00-00-00_000001_12"
    ours, other = _holder(mine), _holder(theirs)
    driver = _driver(mine, "time.sleep(120)")
    try:
        watchdog = int(driver.stdout.readline())
        time.sleep(1.0)  # the watchdog is polling
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        assert _gone(ours, 8), "the killed driver's session process is still running"
        assert ours.returncode == -signal.SIGTERM
        assert other.poll() is None, "another session's process was touched"
        deadline = time.time() + 5
        while read_proc(watchdog) is not None and read_proc(watchdog).cmdline and time.time() < deadline:
            time.sleep(0.1)
        assert not (read_proc(watchdog) or ProcInfo(0, ())).cmdline, "the watchdog did not exit"
    finally:
        for p in (ours, other, driver):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_driver_that_stops_its_watchdog_leaves_its_session_alone(tmp_path):
    mine = tmp_path / "session_2026-01-01_00-00-00_000001_1"
    ours = _holder(mine)
    driver = _driver(mine, "time.sleep(1.0); ray_reaper.stop(w); print(w.returncode, flush=True)")
    try:
        driver.stdout.readline()
        assert driver.stdout.readline().strip() == str(-signal.SIGTERM)
        assert driver.wait(timeout=10) == 0
        time.sleep(1.0)  # what the watchdog would need to act, had it survived
        assert ours.poll() is None, "the watchdog killed the session on a normal exit"
    finally:
        for p in (ours, driver):
            if p.poll() is None:
                p.kill()
                p.wait()
