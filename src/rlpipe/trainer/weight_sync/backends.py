"""RDT backends: per-backend checks on actor probes, and the Ray actor class options each needs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlpipe.trainer.weight_sync.actor_side import ActorProbe
from rlpipe.trainer.weight_sync.errors import BackendUnavailableError

log = logging.getLogger(__name__)


def _need_cuda(backend: str, probes: Sequence[ActorProbe]) -> None:
    for p in probes:
        if not p.cuda_available or not p.model_device.startswith("cuda"):
            raise BackendUnavailableError(
                f"rdt/{backend} needs every weight-sync actor's model on a CUDA GPU, but {p.name} has "
                f"device {p.model_device} (CUDA available: {p.cuda_available}); use rdt/gloo or object_store")


def _check_nccl_packages(probes: Sequence[ActorProbe]) -> None:
    missing = [p.name for p in probes if not p.has_cupy]
    if missing:
        raise BackendUnavailableError(f"rdt/nccl needs cupy (Ray's NCCL group uses it), missing in {missing}: "
                                      "pip install cupy-cuda12x, or use rdt/gloo or object_store")


def _check_nccl(probes: Sequence[ActorProbe]) -> None:
    _need_cuda("nccl", probes)
    _check_nccl_packages(probes)
    uuids = [p.gpu_uuid for p in probes]
    if len(set(uuids)) != len(uuids):
        raise BackendUnavailableError(f"rdt/nccl needs each actor on its own GPU, but GPUs {uuids} repeat; "
                                      "use rdt/cuda_ipc for actors sharing one GPU")


def _check_cuda_ipc(probes: Sequence[ActorProbe]) -> None:
    _need_cuda("cuda_ipc", probes)
    if len({p.gpu_uuid for p in probes}) != 1:
        raise BackendUnavailableError("rdt/cuda_ipc only works between actors sharing one GPU, but these "
                                      f"are on {[p.gpu_uuid for p in probes]}; use rdt/nccl (or rdt/nixl)")


def _check_nixl(probes: Sequence[ActorProbe]) -> None:
    missing = [p.name for p in probes if not p.has_nixl]
    if missing:
        raise BackendUnavailableError(f"rdt/nixl: the nixl package is not importable in {missing}; "
                                      "pip install nixl or use rdt/nccl (GPU) or rdt/gloo (CPU)")


@dataclass(frozen=True)
class RdtBackend:
    ray_name: str  # tensor_transport name Ray expects
    export_device: str | None  # "cpu" for gloo; None keeps the model's device
    collective: bool  # needs a collective group (created from the driver)
    check: Callable[[Sequence[ActorProbe]], None]  # on the actors' probes, in setup()
    # on the driver's own probe before Ray starts: devices and packages only, since which GPU each
    # actor gets is known only inside the actors
    preflight: Callable[[Sequence[ActorProbe]], None]


def _no_check(probes: Sequence[ActorProbe]) -> None:
    pass


RDT_BACKENDS: dict[str, RdtBackend] = {
    "gloo": RdtBackend("GLOO", "cpu", True, _no_check, _no_check),
    "nccl": RdtBackend("NCCL", None, True, _check_nccl,
                       lambda p: (_need_cuda("nccl", p), _check_nccl_packages(p))),
    "nixl": RdtBackend("NIXL", None, False, _check_nixl, _check_nixl),
    "cuda_ipc": RdtBackend("CUDA_IPC", None, False, _check_cuda_ipc, lambda p: _need_cuda("cuda_ipc", p)),
}


def check_backend(backend: str, probes: Sequence[ActorProbe]) -> None:
    """Raise ``BackendUnavailableError`` (with advice) when ``backend`` cannot run on these actors."""
    if backend not in RDT_BACKENDS:
        raise ValueError(f"train.weight_sync.backend: {backend!r} is not one of {list(RDT_BACKENDS)}")
    asyncs = [p.name for p in probes if p.is_async]
    if asyncs:
        raise BackendUnavailableError(f"rdt does not support async actors ({asyncs} define async methods); "
                                      "use object_store")
    RDT_BACKENDS[backend].check(probes)


def actor_options(transport: str) -> dict[str, Any]:
    """Ray options the sender's and receivers' actor classes need for ``transport``.

    Pass them to the class decorator, ``ray.remote(**opts)(cls)`` (or use ``ray_actor_class``),
    NOT to ``ActorClass.options(...)``: Ray 2.60 takes ``enable_tensor_transport`` from the class
    metadata built by ``ray.remote`` and silently ignores it in ``.options`` (checked: the handle
    then reports ``_ray_enable_tensor_transport=None``, and the transfer would hang). The RECEIVER
    needs ``enable_tensor_transport`` too (ray-project/ray#66264: without it the receiver never
    starts the background thread that accepts the transfer, and the task hangs until
    ``RAY_rdt_fetch_fail_timeout_milliseconds``, 60 s by default); ``RdtTransport.setup`` checks
    every handle and refuses one that lacks it. ``max_concurrency=1``: see ``RdtTransport``."""
    return {"enable_tensor_transport": True, "max_concurrency": 1} if transport == "rdt" else {}


def ray_actor_class(cls: type, transport: str) -> Any:
    """``cls`` as a Ray actor class ready for ``transport``; add resources with ``.options``."""
    import ray

    opts = actor_options(transport)
    return ray.remote(**opts)(cls) if opts else ray.remote(cls)
