"""Whether Ray can place a run's actors at all, checked before it is asked to.

An actor that asks for more than its Ray instance has (a GPU that Ray never counted, a CPU share
above ``ray.num_cpus``) is not an error in Ray: it waits, pending, for resources that will never
come, and the driver's first ``ray.get`` waits with it. A run on a local instance knows all that
instance has (what it was started with), so each actor's request is checked against the total
before it is made, and a shortfall fails the run at once, naming each actor's ask. An attached
cluster (``ray.address``) may grow, so it is not checked here: a request it never places ends at
``train.actor_start_timeout_s`` like any actor that does not start.

A run across nodes (``workflow.nodes_per_disaggregated``, attached to the allocation's cluster that
``rlpipe.ray_slurm`` started) first waits until that many nodes have joined (``wait_for_nodes``: a
worker that cannot join is an error naming the nodes that did, not a run on fewer), then places its
learner and generator through one ``STRICT_SPREAD`` placement group, a bundle each, so that they land
on different nodes (``spread_group``); Ray never places two bundles of such a group on one node. Each
actor's node is recorded (``node_ref``: Ray's node id, the node's name under SLURM, its address), in
``run_info.json`` as ``nodes`` and, across nodes, in one line of the job's log.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.util.placement_group import PlacementGroup
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

RESOURCES = ("CPU", "GPU")


class PlacementError(RuntimeError):
    """The run's actors ask Ray for more than its instance has; the message names what and whom."""


def shortfall(asks: dict[str, dict[str, float]], have: dict[str, float]) -> str | None:
    """Why ``asks`` (actor -> {resource: amount}) cannot all be placed on ``have`` (Ray's
    ``cluster_resources()``), or None when they fit."""
    for resource in RESOURCES:
        wanted = {who: ask.get(resource, 0.0) for who, ask in asks.items() if ask.get(resource, 0.0) > 0}
        total = sum(wanted.values())
        if total > have.get(resource, 0.0) + 1e-9:
            each = ", ".join(f"{who}: {amount:g}" for who, amount in wanted.items())
            return (f"the run's actors ask Ray for {total:g} {resource} ({each}), but this job's Ray instance "
                    f"has {have.get(resource, 0.0):g} {resource}{_hint(resource)}; Ray would wait for it forever")
    return None


def _hint(resource: str) -> str:
    if resource == "GPU":
        return (f" (the job's GPUs, which it was started with: CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!r}; workflow.gpus_per_colocated / "
                "gpus_per_disaggregated declare them)")
    return " (ray.num_cpus, or the job's threads)"


def check(asks: dict[str, dict[str, float]], have: dict[str, float]) -> None:
    """Raise ``PlacementError`` where ``shortfall`` finds one."""
    why = shortfall(asks, have)
    if why:
        raise PlacementError(why)


#: how long a run across nodes waits for its Ray cluster's nodes to join
NODES_TIMEOUT_S = 180.0


def alive_nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def wait_for_nodes(expected: int, timeout_s: float = NODES_TIMEOUT_S) -> None:
    """Wait until the attached cluster has ``expected`` alive nodes; ``PlacementError`` after
    ``timeout_s`` naming those that joined and where the missing node's output is."""
    deadline = time.monotonic() + timeout_s
    while len(nodes := alive_nodes()) < expected:
        if time.monotonic() > deadline:
            joined = ", ".join(f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})" for n in nodes) or "none"
            logs = os.environ.get("RLPIPE_RAY_LOGS")
            where = (f"each node's output is in {logs}/<node>.log" if logs
                     else "see the worker nodes' `ray start` output")
            raise PlacementError(
                f"the run needs {expected} Ray nodes (workflow.nodes_per_disaggregated) but only {len(nodes)} joined "
                f"the cluster within {timeout_s:.0f} s ({joined}): a worker could not join; {where}. A worker needs "
                "the head's address and port reachable, RAY_AUTH_MODE=token and the cluster's token "
                "(~/.ray/auth_token or RAY_AUTH_TOKEN) on its node")
        time.sleep(1.0)


def spread_group(asks: list[dict[str, float]], timeout_s: float) -> PlacementGroup:
    """A ``STRICT_SPREAD`` placement group of one bundle per ask (each on its own node), ready;
    ``PlacementError`` naming the bundles and the nodes when Ray cannot place it in ``timeout_s``."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [{k: v for k, v in ask.items() if v > 0} for ask in asks]
    group = placement_group(bundles, strategy="STRICT_SPREAD")
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        have = [(n["NodeManagerAddress"], n["NodeID"][:8], n["Resources"]) for n in alive_nodes()]
        raise PlacementError(f"Ray could not place {bundles} on {len(bundles)} different nodes within "
                             f"{timeout_s:.0f} s; the cluster's nodes: {have}") from None
    return group


def bundle_strategy(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    """The scheduling strategy of bundle ``index`` of ``group``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)


def _node(actor) -> dict[str, str]:  # runs inside the actor (``__ray_call__`` passes the instance)
    import ray

    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "node_name": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            "address": ray.util.get_node_ip_address()}


def node_ref(handle) -> ObjectRef:
    """A ref to the node record of ``handle``'s process (``node_id``, ``node_name``, ``address``)."""
    return handle.__ray_call__.remote(_node)
