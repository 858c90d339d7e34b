"""The driver waits for a dead actor's process to exit before it reads what the actor wrote
(``rlpipe.trainer.drivers.actor_exit``): real processes, a real Ray instance."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rlpipe.trainer import ray_reaper
from rlpipe.trainer.drivers import actor_exit

pytestmark = pytest.mark.ray


def test_waits_until_the_process_has_exited_then_reports_it_gone(ray_session):
    import ray

    node = ray.get_runtime_context().get_node_id()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    try:
        t0 = time.monotonic()
        assert actor_exit.wait_exited(ray.put((proc.pid, node)), timeout_s=30)
        waited = time.monotonic() - t0
        assert proc.poll() is not None or ray_reaper.running(proc.pid) is False  # exited (a zombie until reaped)
        assert waited >= 0.3, f"returned after {waited:.2f}s, before the process could have exited"
    finally:
        proc.kill()
        proc.wait()


def test_gives_up_at_its_timeout_and_skips_a_process_on_another_node(ray_session):
    import ray

    node = ray.get_runtime_context().get_node_id()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        t0 = time.monotonic()
        assert not actor_exit.wait_exited(ray.put((proc.pid, node)), timeout_s=0.3)
        assert 0.3 <= time.monotonic() - t0 < 5
        assert not actor_exit.wait_exited(ray.put((proc.pid, "another-node")), timeout_s=30)
        assert not actor_exit.wait_exited(None)
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_actors_process_is_waited_for(ray_session):
    import ray

    @ray.remote(num_cpus=0)
    class Holder:
        def ping(self):
            return True

    actor = Holder.remote()
    where = actor_exit.where_ref(actor)
    ray.get(actor.ping.remote())
    pid, _ = ray.get(where)
    ray.kill(actor, no_restart=True)
    assert actor_exit.wait_exited(where, timeout_s=30)
    assert not ray_reaper.running(pid)
