"""The math grader's time bound: math-verify in a child Python process that is killed when one
answer takes too long (``rlpipe.tasks.math.grader`` sends it one answer at a time).

A process, not a timer: math-verify's own timeouts use ``signal.alarm``, which fails off the main
thread (Ray actors, thread pools), so they are off; and the grader's screening (``grader._parse``)
cannot foresee everything (``verify(log(10001), 9123456789)`` makes sympy build
``10001**9123456789``). ``GraderProcess`` is the parent's side, ``serve`` the child's: JSON lines
over pipes; the child says "ready" once warmed up and exits when its stdin closes or its parent
dies.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class GraderProcess:
    """A child Python process that runs ``serve_code`` (code that ends in a ``serve`` call), so a
    runaway computation is killed after the request's time limit, from any thread. One request at
    a time."""

    STARTUP_TIMEOUT_S = 120.0  # importing sympy + math-verify on a loaded machine

    def __init__(self, serve_code: str) -> None:
        self._serve_code = serve_code
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def _start(self) -> None:
        pkg_root = str(Path(__file__).resolve().parents[3])  # the child imports this very rlpipe
        path = os.pathsep.join(filter(None, [pkg_root, os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONPATH=path)
        self._proc = subprocess.Popen([sys.executable, "-c", self._serve_code],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        assert self._proc.stdout is not None
        if read_line(self._proc.stdout.fileno(), self.STARTUP_TIMEOUT_S) != b"ready\n":
            self._kill()
            raise RuntimeError("the math grader child process did not start")

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def request(self, payload: dict[str, Any], timeout_s: float) -> tuple[bool, bool] | None:
        """The child's (found, ok), or None when it timed out or died (it restarts on the next
        request). Raises RuntimeError when a child cannot be started at all."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
            try:
                self._proc.stdin.write(json.dumps(payload).encode() + b"\n")
                self._proc.stdin.flush()
                line = read_line(self._proc.stdout.fileno(), timeout_s)
            except OSError:
                line = None
            if line is None:
                self._kill()
                return None
            reply = json.loads(line)
            if "error" in reply:
                logger.warning("math grader error on %r: %s; scoring 0", payload["text"][:80], reply["error"])
            return bool(reply["found"]), bool(reply["ok"])

    def close(self) -> None:
        with self._lock:
            self._kill()

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's grader process and lock state are not ours to use."""
        self._lock, self._proc = threading.Lock(), None


def read_line(fd: int, timeout_s: float) -> bytes | None:
    """One newline-terminated line from ``fd``, or None on timeout / end of file."""
    deadline, buf = time.monotonic() + timeout_s, b""
    while not buf.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        buf += chunk
    return buf


def serve(handle: Callable[[dict[str, Any]], tuple[bool, bool]], warm_up: Callable[[], None]) -> None:
    """Child side of ``GraderProcess``: ``warm_up()``, "ready", then one JSON request per stdin line
    and one reply per line, ``{"found", "ok"}`` from ``handle(request)`` (or ``"error"``)."""
    logging.disable(logging.WARNING)  # math-verify's "timeout is disabled" notice: we are the timeout
    parent = os.getppid()

    def exit_when_orphaned() -> None:  # a parent killed mid-request would otherwise leave us running
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=exit_when_orphaned, daemon=True).start()
    replies = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the reply stream
    warm_up()  # before "ready", so requests are timed without the imports
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin.buffer:
        req = json.loads(line)
        if req["kind"] == "sleep":  # lets tests exercise the timeout without a real runaway
            time.sleep(float(req["text"]))
        reply: dict[str, Any] = {"found": False, "ok": False}
        try:
            reply["found"], reply["ok"] = handle(req)
        except Exception as err:
            reply["error"] = f"{type(err).__name__}: {err}"[:300]
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
