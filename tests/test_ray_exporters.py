"""A local Ray instance started by ``rlpipe train`` collects no metrics (the node's Prometheus
exporter does not start) and moves the two exporters Ray cannot switch off to ephemeral ports.
Checked on the options ``init_ray`` hands to Ray (no Ray started: probing the exporters of a live
instance takes half a minute; the measurement is in rlpipe.trainer.local_ray's docstring)."""

from __future__ import annotations

import os
import types

import pytest

from rlpipe.trainer import local_ray


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
