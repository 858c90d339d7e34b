"""Where each actor's process runs, so that the driver can wait for a dead actor's process to be
gone before it reads what that actor may still be writing.

Ray reports an actor dead (``RayActorError`` in the driver) as soon as it knows, which can be a few
milliseconds before the actor's process has exited: after ``ray.kill``, the learner's checkpoint
thread (``rlpipe.trainer.actors.checkpoint_writer``) can still rename a finished ``last.pt`` into
place in that window. The resume advice names the checkpoint's step from the file, so the driver
first waits (``wait_exited``, bounded) until the process is gone; the file can then no longer
change. Only a process on the driver's own node can be waited for; elsewhere the wait is skipped.
"""

from __future__ import annotations

import os
import time

import ray

from rlpipe.trainer import ray_reaper

#: how long the driver waits for a dead actor's process to exit before reading its files anyway
EXIT_WAIT_S = 10.0


def _where(actor) -> tuple[int, str]:  # runs inside the actor (``__ray_call__`` passes the instance)
    return os.getpid(), ray.get_runtime_context().get_node_id()


def where_ref(handle):
    """A ref to ``(pid, node id)`` of ``handle``'s process: the actor's first call, not waited for."""
    return handle.__ray_call__.remote(_where)


def wait_exited(ref, timeout_s: float = EXIT_WAIT_S) -> bool:
    """Wait until the process behind ``where_ref``'s ``ref`` has exited, at most ``timeout_s``.
    True when it is known to be gone; False when it is not (still running, on another node, or its
    pid never reached the driver)."""
    if ref is None:
        return False
    try:
        pid, node = ray.get(ref, timeout=0)
    except Exception:  # never answered (died at start-up), or not ready: nothing to wait for
        return False
    if node != ray.get_runtime_context().get_node_id():
        return False
    deadline = time.monotonic() + timeout_s
    while ray_reaper.running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
