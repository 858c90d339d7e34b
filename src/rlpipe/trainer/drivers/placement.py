"""Whether Ray can place a run's actors at all, checked before it is asked to.

An actor that asks for more than its Ray instance has (a GPU that Ray never counted, a CPU share
above ``ray.num_cpus``) is not an error in Ray: it waits, pending, for resources that will never
come, and the driver's first ``ray.get`` waits with it. A run on a local instance knows all that
instance has (what it was started with), so each actor's request is checked against the total
before it is made, and a shortfall fails the run at once, naming each actor's ask. An attached
cluster (``ray.address``) may grow, so it is not checked here: a request it never places ends at
``train.ray_timeout_s`` like any other unanswered call.
"""

from __future__ import annotations

import os

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
