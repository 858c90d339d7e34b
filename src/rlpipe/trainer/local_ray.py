"""The local Ray instance of ``rlpipe train`` (and of the benches that run training inside one):
started loopback-only, with token authentication and without metrics exporters on fixed ports, with
a watchdog that stops it if the starting process is killed; or, with ``ray.address``, an attached
cluster left as its operator configured it.

Network exposure of a local Ray instance (measured on Ray 2.60, ``init_ray``): it listens on the
loopback address only, so nothing of it answers from another machine. Ray turns a node address of
``127.0.0.1`` into the machine's outward address (``services.resolve_ip_for_localhost``) unless
its cluster support is off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the default on macOS and
Windows, read when ``ray`` is imported: ``init_ray`` sets it for the Ray processes it starts and
in this process for the duration of ``ray.init``). With it, and no dashboard (unless
``ray.include_dashboard``, then on 127.0.0.1), the GCS, the raylet, the object manager, the
dashboard and runtime-env agents, the metrics exporters and every worker bind 127.0.0.1 (a test
lists the listening sockets of a run's processes). Of Ray's three Prometheus exporters, which answer
without the token, the node's is off (no metrics collection), and the other two do not run: their
processes, the autoscaler monitor and the dashboard's API server, are left out
(``only_what_a_run_needs``); with ``ray.include_dashboard`` they run, on ephemeral ports
instead of their fixed ones (``METRICS_PORT_VARIABLES``). Other users of the same machine can still
reach loopback: what protects the servers from them is Ray's token authentication, on by default since
2.5x (every RPC needs the session's token), so ``init_ray`` refuses to start a local instance with
``RAY_AUTH_MODE=disabled``. It always starts its own (``address="local"``): a plain ``ray.init()``
would attach to a cluster that ``ray start`` registered on this machine. Beside it runs a watchdog
(``rlpipe.trainer.ray_reaper``) that stops that instance's processes at once if this process is
killed with no chance to call ``ray.shutdown``; Ray alone would leave them running for a while.
"""

from __future__ import annotations

import contextlib
import logging
import os

from rlpipe.config import ConfigError
from rlpipe.trainer import ray_reaper

#: A local instance collects no metrics: nothing reads them (rlpipe records its own), and the node's
#: Prometheus exporter (the dashboard agent's) then does not start at all.
LOCAL_RAY_SYSTEM_CONFIG = {"enable_metrics_collection": False}
#: Ray 2.60 has no switch for the two other exporters (the dashboard head's and the autoscaler
#: monitor's; their processes run only with ray.include_dashboard, see only_what_a_run_needs): these
#: variables, read by those processes when they start, move them from their fixed ports (44227,
#: 44217) to ephemeral ones, so two runs on one machine do not collide and nothing answers at a
#: well-known port; they stay on loopback.
METRICS_PORT_VARIABLES = ("DASHBOARD_METRIC_PORT", "AUTOSCALER_METRIC_PORT")


def local_ray_metrics_off() -> dict:
    """``ray.init`` keyword arguments for a local instance with the metrics exporters off or moved
    (``LOCAL_RAY_SYSTEM_CONFIG``; sets ``METRICS_PORT_VARIABLES`` in this process's environment,
    which the instance's processes inherit, unless the user set them)."""
    for name in METRICS_PORT_VARIABLES:
        os.environ.setdefault(name, "0")
    return {"_system_config": dict(LOCAL_RAY_SYSTEM_CONFIG)}


def init_ray(cfg, num_cpus: float, num_gpus: int | None = None):
    """Start a local Ray instance, or attach to ``ray.address``. For a local one, the watchdog that
    stops it if this process is killed (``rlpipe.trainer.ray_reaper``); None when attached.
    ``num_gpus``: the job's GPU slots, which the local instance is started with (None: Ray counts the
    GPUs it finds, which on a scheduler's node may be none it can count)."""
    import ray

    # Ray starts worker processes at niceness 15 by default: on a shared machine any other process
    # then preempts the training actors and every phase timing is inflated. Run them at normal
    # priority (only affects a Ray instance started here).
    os.environ.setdefault("RAY_worker_niceness", "0")
    quiet = "ignore::DeprecationWarning"
    if cfg.ray.address:  # the cluster's workers do not inherit our environment: pass it along
        ray.init(address=cfg.ray.address, runtime_env={"env_vars": {"PYTHONWARNINGS": quiet}}, log_to_driver=True)
        return None
    if os.environ.get("RAY_AUTH_MODE", "token") != "token":
        # every user of this machine can reach the local servers on loopback (see the module
        # docstring): the token is their lock. (Setting the variable here would not help: Ray reads
        # it when it is imported.)
        raise ConfigError(f"RAY_AUTH_MODE={os.environ['RAY_AUTH_MODE']}: rlpipe starts a local Ray instance only with "
                          "token authentication (its servers are reachable by every user of this machine); "
                          "unset RAY_AUTH_MODE")
    # address="local": always a new instance of our own, never a cluster that `ray start` left
    # registered in /tmp/ray (ray.init() without an address would try to attach to it)
    # A local instance's workers inherit this process's environment. A runtime_env would do the same
    # but its agent adds ~0.8 s to every actor start (measured side by side; ray.init unchanged),
    # paid by each actor of the default pipeline's ~35 runs.
    os.environ.setdefault("PYTHONWARNINGS", quiet)
    with loopback_only(), only_what_a_run_needs(cfg.ray.include_dashboard):
        gpu_kwargs = {} if num_gpus is None else {"num_gpus": num_gpus}
        ray.init(address="local", num_cpus=cfg.ray.num_cpus or num_cpus, include_dashboard=cfg.ray.include_dashboard,
                 **gpu_kwargs,
                 dashboard_host="127.0.0.1", _node_ip_address="127.0.0.1",
                 logging_level=logging.WARNING, configure_logging=True, **local_ray_metrics_off())
    return ray_reaper.start(ray._private.worker.global_worker.node.get_session_dir_path())


@contextlib.contextmanager
def loopback_only():
    """Ray's cluster support off while a local instance starts, so that its node address stays
    127.0.0.1 and every server binds loopback (see the module docstring). The Ray processes read the
    variable when they start; this process read it when it imported ``ray``, so its copy is set too.
    Both are restored afterwards: once the node exists, Ray takes the address from it, and a process
    this one starts later (an sbatch, a Ray cluster of its own) must not inherit "cluster support off"."""
    from ray._private import ray_constants

    name = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    env_before = os.environ.get(name)
    os.environ[name] = "0"
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before
        if env_before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = env_before


#: What a local instance leaves out, unless ``ray.include_dashboard``: not one of its processes is
#: needed by a run, and each is a Python process that imports much of Ray (and the API server's
#: aiohttp and OpenTelemetry) on the job's cores while ``ray.init`` waits for it.
LEFT_OUT = ("the autoscaler monitor (a local instance has the resources it was started with: nothing to scale)",
            "the dashboard's API server (no dashboard, job submission or state API is used)",
            "the dashboard agent's HTTP server and metrics (the agent runs in Ray's minimal mode)")


@contextlib.contextmanager
def only_what_a_run_needs(include_dashboard: bool):
    """While a local instance starts (``ray.init``), Ray starts only what a training run uses
    (``LEFT_OUT``; with ``include_dashboard`` everything, as Ray would). Ray 2.60 has no switch for
    these from ``ray.init``: its own functions are replaced for the duration, and restored after.
    Fewer processes also means fewer listening sockets (two of Ray's metrics exporters among them)."""
    from ray._private import node, services, utils

    saved = (node.Node.start_monitor, services.start_api_server, utils.get_dashboard_dependency_error)
    if not include_dashboard:
        node.Node.start_monitor = lambda self: None
        services.start_api_server = lambda *args, **kwargs: (None, None)
        # what Ray checks to run its dashboard agent minimal (as where its dependencies are missing)
        utils.get_dashboard_dependency_error = lambda: "left out by rlpipe (ray.include_dashboard: false)"
    try:
        yield
    finally:
        node.Node.start_monitor, services.start_api_server, utils.get_dashboard_dependency_error = saved
