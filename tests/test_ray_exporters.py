"""A local Ray instance started by ``rlpipe train`` collects no metrics (the node's Prometheus
exporter does not start) and moves the two exporters Ray cannot switch off to ephemeral ports.
Checked on the options ``init_ray`` hands to Ray (no Ray started: probing the exporters of a live
instance takes half a minute; the measurement is in rlpipe.trainer.local_ray's docstring)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest

from rlpipe.trainer import local_ray

METRIC_VARS = local_ray.METRICS_PORT_VARIABLES


@pytest.fixture
def captured(monkeypatch):
    import ray

    seen = {}

    def fake_init(**kwargs):
        seen.update(kwargs, env={k: os.environ.get(k) for k in local_ray.METRICS_PORT_VARIABLES})
        raise RuntimeError("stop here")  # nothing else of init_ray runs

    monkeypatch.setattr(ray, "init", fake_init)
    for name in local_ray.METRICS_PORT_VARIABLES:  # set then deleted: the teardown removes what init_ray sets
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    return seen


def _cfg(address=None):
    return types.SimpleNamespace(ray=types.SimpleNamespace(address=address, num_cpus=None, include_dashboard=False))


def test_a_local_instance_collects_no_metrics_and_uses_no_fixed_metrics_port(captured):
    with pytest.raises(RuntimeError, match="stop here"):
        local_ray.init_ray(_cfg(), num_cpus=1)
    assert captured["address"] == "local"
    assert captured["_system_config"] == {"enable_metrics_collection": False}
    assert captured["env"] == {"DASHBOARD_METRIC_PORT": "0", "AUTOSCALER_METRIC_PORT": "0"}


def test_an_attached_cluster_is_left_as_its_operator_configured_it(captured):
    with pytest.raises(RuntimeError, match="stop here"):
        local_ray.init_ray(_cfg("ray://head:10001"), num_cpus=1)
    assert "_system_config" not in captured


def test_a_local_instance_starts_only_what_a_run_needs(captured):
    """While ``ray.init`` runs, no autoscaler monitor, no dashboard API server and a minimal dashboard
    agent (``local_ray.only_what_a_run_needs``); Ray's own functions are back afterwards."""
    import ray
    from ray._private import node, services, utils

    before = (node.Node.start_monitor, services.start_api_server, utils.get_dashboard_dependency_error)
    seen = {}

    def fake_init(**kwargs):
        seen.update(monitor=node.Node.start_monitor(None), api=services.start_api_server(True, False),
                    minimal=utils.get_dashboard_dependency_error())
        raise RuntimeError("stop here")

    ray.init = fake_init  # the fixture restores it
    with pytest.raises(RuntimeError, match="stop here"):
        local_ray.init_ray(_cfg(), num_cpus=1)
    assert seen == {"monitor": None, "api": (None, None), "minimal": seen["minimal"]} and seen["minimal"]
    assert (node.Node.start_monitor, services.start_api_server, utils.get_dashboard_dependency_error) == before


def test_a_dashboard_asked_for_gets_everything_ray_starts(captured):
    import ray
    from ray._private import services

    own = services.start_api_server
    seen = {}

    def fake_init(**kwargs):
        seen["api"] = services.start_api_server
        raise RuntimeError("stop here")

    ray.init = fake_init  # the fixture restores it
    cfg = _cfg()
    cfg.ray.include_dashboard = True
    with pytest.raises(RuntimeError, match="stop here"):
        local_ray.init_ray(cfg, num_cpus=1)
    assert seen["api"] is own


@pytest.mark.ray
def test_a_real_local_instance_runs_no_monitor_and_no_dashboard_server():
    """A local instance started by ``init_ray`` (in a fresh interpreter, beside any Ray of the test
    session): none of its processes is the autoscaler monitor or the dashboard's API server, and the
    dashboard agent runs minimal (Ray's default starts all three in full)."""
    code = textwrap.dedent("""
        import types, psutil, ray
        from rlpipe.trainer import local_ray, ray_reaper
        cfg = types.SimpleNamespace(ray=types.SimpleNamespace(address=None, num_cpus=None, include_dashboard=False))
        watchdog = local_ray.init_ray(cfg, num_cpus=1)
        try:
            for p in psutil.Process().children(recursive=True):
                try:
                    print(" ".join(p.cmdline()))
                except psutil.Error:
                    pass
        finally:
            ray.shutdown()
            ray_reaper.stop(watchdog)
    """)
    env = {k: v for k, v in os.environ.items() if k not in METRIC_VARS}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cmds = proc.stdout.splitlines()
    assert any("gcs_server" in c for c in cmds) and any("raylet" in c for c in cmds), cmds
    assert not [c for c in cmds if "autoscaler/_private/monitor.py" in c or "dashboard/dashboard.py" in c], cmds
    agents = [c for c in cmds if "dashboard/agent.py" in c]
    assert agents and all("--minimal" in c for c in agents), agents
