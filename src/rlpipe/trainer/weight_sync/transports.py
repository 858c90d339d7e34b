"""The driver side of weight sync: ``Transport`` classes and ``make_transport``.

``make_transport(cfg)`` picks the class from ``TRANSPORTS`` (``ChannelTransport`` for a channel)
and, for rdt, runs a driver-side ``preflight`` (CUDA present? nixl / cupy importable?) so that an
unavailable backend fails before Ray starts. The driver then calls ``setup(sender, receivers)``
once before training (the authoritative checks, on probes taken inside the actors: devices, which
physical GPU, packages, async methods), ``sync(sender, receivers, version) -> SyncStats`` after
each policy update, and ``teardown()`` at the end.

=================  ==========================================================================
``local``          in-process copy (``copy_weights``) for the ColocatedWorker, which holds the
                   learner's and the generator's model in one actor (``LocalTransport``).
``object_store``   (the default, ``channel: true``; label ``object_store/channel``) Ray's object
                   store through a shared-memory channel that the sender opens at ``setup``
                   (``ChannelTransport``).
``object_store``   ``channel: false``: the sender's task returns the ``ShmPayload``, which Ray
                   copies into a fresh object in shared memory every sync (``ObjectStoreTransport``).
``rdt/gloo``       Ray Direct Transport over a gloo collective group (CPU tensors): the tensors
                   stay in the sender's process and go sender -> receiver over a socket, with no
                   object-store serialisation. Works on CPU-only machines (``RdtTransport``).
``rdt/nccl``       RDT over NCCL, GPU to GPU, for actors on *separate* GPUs (needs cupy).
``rdt/nixl``       RDT over NIXL (one-sided RDMA, GPU or CPU); needs the ``nixl`` package.
``rdt/cuda_ipc``   RDT over CUDA IPC handles, for two actors sharing *one* GPU.
=================  ==========================================================================
"""

from __future__ import annotations

import importlib.util
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from rlpipe.trainer.weight_sync.actor_side import ActorProbe, LoadAck, WeightReceiver
from rlpipe.trainer.weight_sync.backends import RDT_BACKENDS, check_backend
from rlpipe.trainer.weight_sync.errors import (
    RDT_TIMEOUT_ENV,
    BackendUnavailableError,
    WeightSyncError,
    WeightSyncTimeout,
)
from rlpipe.trainer.weight_sync.payload import (
    SyncStats,
    _load_into,
    _stats,
    flat_weights,
    weights_checksum,
)

log = logging.getLogger(__name__)


class Transport(ABC):
    """Driver-side weight sync. ``sender``/``receivers`` are actor handles (objects for local)."""

    name: ClassVar[str]

    def __init__(self, timeout_s: float, backend: str | None = None):
        if timeout_s <= 0:
            raise ValueError(f"train.weight_sync.timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.backend = backend
        self._broken = False  # set after a failed sync: teardown must not wait on stuck actors

    @property
    def label(self) -> str:
        return self.name if self.backend is None else f"{self.name}/{self.backend}"

    def setup(self, sender: Any, receivers: Sequence[Any]) -> None:
        """Validate (and connect) the actors; raises before training when this cannot work."""
        if not receivers:
            raise ValueError(f"weight sync {self.label}: no receivers")

    @abstractmethod
    def sync(self, sender: Any, receivers: Sequence[Any], version: int, checksum: bool = False) -> SyncStats:
        ...

    def teardown(self) -> None:  # noqa: B027 - optional hook: most transports hold nothing to release
        pass

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()


class LocalTransport(Transport):
    """In-process copy; ``sender``/``receivers`` are modules or objects holding ``.model``."""

    name = "local"

    def setup(self, sender: Any, receivers: Sequence[Any]) -> None:
        super().setup(sender, receivers)
        for obj in (sender, *receivers):
            if not isinstance(obj, nn.Module) and not isinstance(getattr(obj, "model", None), nn.Module):
                raise BackendUnavailableError(
                    f"transport 'local' copies in-process and needs modules (or objects with .model), got "
                    f"{type(obj).__name__}; for separate actors use object_store or rdt")

    def sync(self, sender: Any, receivers: Sequence[Any], version: int, checksum: bool = False) -> SyncStats:
        def module(o: Any) -> nn.Module:
            return o if isinstance(o, nn.Module) else o.model

        start, t0 = time.time(), time.perf_counter()
        nbytes = 0
        for r in receivers:
            nbytes = _load_into(flat_weights(module(r)), flat_weights(module(sender)))
            if isinstance(r, WeightReceiver):
                r.weights_version = version
        sums = [weights_checksum(module(r)) for r in receivers] if checksum else None
        return _stats(self.name, None, version, nbytes, len(receivers), start, t0, sums)


class _RayTransport(Transport):
    """Shared by object_store and rdt: export on the sender, load on each receiver, bounded wait.

    Every sync is timed on the driver (``SyncStats.seconds``: from submitting the export to the last
    receiver's ack), logged with bytes and GB/s (decimal, bytes moved to all receivers / seconds),
    and bounded by ``ray.get(..., timeout=timeout_s)``; a timeout raises ``WeightSyncTimeout``
    naming transport/backend, ``train.weight_sync.timeout_s`` and, for rdt, the
    ``RAY_rdt_fetch_fail_timeout_milliseconds`` knob (``_hint``)."""

    def _export(self, sender: Any, receivers: Sequence[Any]) -> Any:
        raise NotImplementedError

    def _hint(self) -> str:
        return "raise train.weight_sync.timeout_s if the model is simply large"

    def _probe(self, actors: Sequence[Any]) -> list[ActorProbe]:
        """Every actor's ``weight_sync_probe`` (bounded by ``timeout_s``), for ``setup``'s checks."""
        import ray

        try:
            return ray.get([a.weight_sync_probe.remote() for a in actors], timeout=self.timeout_s)
        except AttributeError as e:
            raise WeightSyncError(f"{self.label}: the sender must inherit WeightSender and every receiver "
                                  f"WeightReceiver (rlpipe.trainer.weight_sync): {e}") from e
        except ray.exceptions.GetTimeoutError as e:
            raise WeightSyncTimeout(f"{self.label}: the actors did not answer the start-up probe within "
                                    f"train.weight_sync.timeout_s={self.timeout_s:g} s") from e

    def _submit(self, sender: Any, receivers: Sequence[Any], version: int, checksum: bool) -> list[Any]:
        """The refs one sync waits for; the last ``len(receivers)`` are the receivers' ``LoadAck``s."""
        ref = self._export(sender, receivers)
        # ``ref`` dies on return: the driver's reference must not outlive the sync (frees RDT's copy)
        return [r.load_weights.remote(ref, version, checksum) for r in receivers]

    def sync(self, sender: Any, receivers: Sequence[Any], version: int, checksum: bool = False) -> SyncStats:
        import ray

        start, t0 = time.time(), time.perf_counter()
        waits = self._submit(sender, receivers, version, checksum)
        try:
            results: list[LoadAck] = ray.get(waits, timeout=self.timeout_s)[len(waits) - len(receivers):]
        except KeyboardInterrupt:  # an actor may still block on this sync: teardown must not wait on it
            self._broken = True
            raise
        except ray.exceptions.GetTimeoutError as e:
            self._broken = True
            raise WeightSyncTimeout(f"weight sync {self.label} (version {version}) did not finish within "
                                    f"train.weight_sync.timeout_s={self.timeout_s:g} s; {self._hint()}") from e
        except ray.exceptions.RayError as e:
            self._broken = True
            raise WeightSyncError(f"weight sync {self.label} (version {version}) failed: {e}") from e
        sums = [a.checksum for a in results] if checksum else None
        return _stats(self.name, self.backend, version, results[0].bytes, len(results), start, t0, sums)


# object-store payloads: how the sender's task returns the weights (``ObjectStoreTransport(payload=)``)
OBJECT_STORE_PAYLOADS: dict[str, Callable[[Any], Any]] = {
    # ShmPayload: uint8 numpy views of the model's CPU tensors (packed off the CPU); zero-copy reads
    "shared": lambda sender: sender.export_weights_shm.remote(None),
    # ShmPayload packed per dtype even on CPU: one more copy on the sender (measured in the bench)
    "packed": lambda sender: sender.export_weights_shm.remote(True),
    # named torch tensors: pickled in band, copied out again on the receiver (the naive baseline)
    "tensors": lambda sender: sender.export_weights.remote("cpu", False),
}


class ObjectStoreTransport(_RayTransport):
    """Ray's object store. The default ``payload="shared"`` returns a ``ShmPayload``: the receiver
    reads the weights from shared memory with no deserialising copy and copies them in place.

    Torch tensors returned from a task would be pickled *in band*: copied into the object store,
    deserialised into fresh tensors on the receiver (page-faulted), then copied into the model:
    100 MB took ~330-440 ms on the 2-core dev machine. The ``ShmPayload`` path: ~50 ms for 100 MB
    at load average ~2 (two memcpys plus Ray's fixed ~10 ms), ~90 ms with the 2 cores 2-3x
    oversubscribed by other processes. ``payload="tensors"`` keeps the naive path for comparison,
    ``"packed"`` the per-dtype pack on CPU too (``OBJECT_STORE_PAYLOADS``)."""

    name = "object_store"

    def __init__(self, timeout_s: float, backend: str | None = None, payload: str = "shared"):
        if payload not in OBJECT_STORE_PAYLOADS:
            raise ValueError(f"object_store payload {payload!r} is not one of {list(OBJECT_STORE_PAYLOADS)}")
        super().__init__(timeout_s, None)
        self.payload = payload

    def _export(self, sender: Any, receivers: Sequence[Any]) -> Any:
        return OBJECT_STORE_PAYLOADS[self.payload](sender)


class ChannelTransport(_RayTransport):
    """The object store's reusable buffer: a Ray shared-memory channel (``ray.experimental.channel``,
    the mutable objects behind Ray Compiled Graphs). ``setup`` has the sender create one channel
    buffer sized for its weights (Ray requires the writer to create it) and registers every
    receiver as a reader. Each sync the sender writes a ``ShmPayload`` into that same buffer (one
    copy into pages already mapped, instead of a fresh object per sync) while each receiver reads
    it zero-copy and copies it into its tensors in place. A write waits until every reader has
    moved past the previous value, so the driver submits the write and the reads together; both
    sides are idle at a sync (the drivers sync between batches), so the wait couples nothing.
    Label ``object_store/channel``.

    Why the reused buffer: a fresh object per sync lands in object-store pages the sender has to
    fault in again; the channel writes into the same mapped buffer every time. Measured (100 MB,
    2 cores, Ray 2.60, ``rlpipe bench weight-sync``): fresh object ~30-34 ms (0.30-0.33 of the
    in-run memcpy), channel ~25-28 ms (0.36-0.42); two memcpys are ~21 ms. Multi-node readers get
    the value pushed by Ray (one buffer per node). The channel is the default because it was faster
    at every payload of the bench's sweep on the dev machine (one run, load ~1: the pipeline's 5 MB
    model 7.0 vs 9.9 ms, 1 MB 3.8 vs 5.4 ms, 100 MB 31 vs 39 ms, 1 GB 263 vs 334 ms)."""

    name = "object_store"

    def __init__(self, timeout_s: float, backend: str | None = None):
        super().__init__(timeout_s, "channel")
        self._key: str | None = None
        self._actor_ids: list[Any] | None = None
        self._sender: Any = None

    def setup(self, sender: Any, receivers: Sequence[Any]) -> None:
        import ray

        super().setup(sender, receivers)
        actors = [sender, *receivers]
        if len({str(a._ray_actor_id) for a in actors}) != len(actors):  # a reader listed twice never reads twice
            raise WeightSyncError(f"{self.label}: the sender and the receivers must be distinct actors")
        probes = self._probe(actors)
        asyncs = [p.name for p in probes if p.is_async]
        if asyncs:  # a blocking channel read would stall an async actor's event loop
            raise BackendUnavailableError(f"{self.label} does not support async actors ({asyncs} define async "
                                          "methods); use object_store without channel")
        self._key = f"rlpipe-weights-{uuid.uuid4().hex[:8]}"
        readers = [(r, p.node_id) for r, p in zip(receivers, probes[1:], strict=True)]
        channel = ray.get(sender.open_weight_channel.remote(self._key, readers), timeout=self.timeout_s)
        self._sender = sender  # from here on, teardown closes the channel
        ray.get([r.attach_weight_channel.remote(self._key, channel) for r in receivers], timeout=self.timeout_s)
        self._actor_ids = [a._ray_actor_id for a in actors]

    def _submit(self, sender: Any, receivers: Sequence[Any], version: int, checksum: bool) -> list[Any]:
        if self._actor_ids is None:
            raise WeightSyncError(f"weight sync {self.label}: call setup(sender, receivers) before sync")
        if sender._ray_actor_id != self._actor_ids[0] or sorted(  # (setup refused duplicates)
                str(r._ray_actor_id) for r in receivers) != sorted(str(i) for i in self._actor_ids[1:]):
            # a write waits for every registered reader: a sync without one of them would hang
            raise WeightSyncError(f"weight sync {self.label}: sync() got other actors than setup() saw")
        write = sender.write_weight_channel.remote(self._key, self.timeout_s)
        return [write, *(r.read_weight_channel.remote(self._key, version, checksum, self.timeout_s)
                         for r in receivers)]

    def teardown(self) -> None:
        """Close the channel (a reader still blocked on it gets an error instead of waiting)."""
        if self._sender is None:
            return
        import ray

        sender, self._sender = self._sender, None
        try:
            ray.get(sender.close_weight_channel.remote(self._key), timeout=5 if self._broken else self.timeout_s)
        except ray.exceptions.RayError as e:  # a dead or stuck sender: its channel dies with it
            log.warning("weight sync %s: could not close channel %s: %s", self.label, self._key, e)


class RdtTransport(_RayTransport):
    """Ray Direct Transport: the sender's packed weights (``export_weights(pack=True)``) move by the
    backend's tensor transport, without the object store.

    RDT limits honoured here (Ray 2.60 docs, "Limitations"): no async actors (``setup`` probes the
    actor classes for ``async def`` methods), ``max_concurrency=1`` for the collective backends
    (gloo, nccl: two concurrent transfers on one communicator could interleave), and an actor is in
    at most one collective group per backend, so ``setup`` creates the group from the driver over
    ``[sender, *receivers]`` and ``teardown`` destroys it. Every handle needs
    ``enable_tensor_transport`` (``backends.actor_options``); ``setup`` refuses one without it.

    What bounds rdt/gloo on CPU (100 MB, 2 cores, one torch thread per actor, Ray 2.60): ~190 ms
    per sync = pack ~18 ms (a warm memcpy; the pack is reused) + the transfer ~50 ms + ~60 ms of
    page faults in the receive buffer + the in-place load ~18 ms + ~45 ms of Ray round trips (export
    task, metadata to the driver, ``__ray_send__``/``__ray_recv__`` tasks, the load task; ~16 ms at
    1 MB). Per-tensor overhead is gone (packed). Socket buffers are not the limit: gloo over
    loopback TCP moves 100 MB between two warm buffers in ~45 ms (~2.2 GB/s, about half a memcpy,
    as every byte is copied into and out of the kernel), and fixed ``SO_SNDBUF``/``SO_RCVBUF``
    sizes were slower than Linux's autotuning in a loopback probe. Threads: gloo sends and receives
    on one thread each, and both actors keep a core busy during the transfer, so more threads
    cannot help on 2 cores. The page faults are Ray's: for two-sided transports (gloo, nccl) it
    allocates a fresh ``torch.empty`` receive buffer per transfer, and ``set_target_for_ref``
    (receive into our own buffer) only works for one-sided transports fetched with ``ray.get``.
    Setting ``THP_MEM_ALLOC_ENABLE=1`` in the actors' environment (torch then requests transparent
    huge pages for large CPU allocations) removed those faults in a probe (fresh receive 109 -> 48
    ms, sync ~190 -> ~120 ms); it is a process-wide memory policy, so it is left to the run's Ray
    ``runtime_env`` (``rlpipe bench weight-sync --thp`` measures it). Even then the object store
    wins on CPU: fewer copies, fewer round trips. RDT's advantage needs GPUs (NCCL, CUDA IPC,
    NIXL), which a CPU machine cannot measure."""

    name = "rdt"

    def __init__(self, timeout_s: float, backend: str | None = None):
        if backend not in RDT_BACKENDS:
            raise ValueError(f"train.weight_sync.backend: {backend!r} is not one of {list(RDT_BACKENDS)}")
        super().__init__(timeout_s, backend)
        self.spec = RDT_BACKENDS[backend]
        self._group: Any = None
        self._actor_ids: list[Any] | None = None

    def _hint(self) -> str:
        return (f"is every receiver created with enable_tensor_transport=True (ray-project/ray#66264)? Ray "
                f"gives up on an RDT fetch after {RDT_TIMEOUT_ENV} (default 60000); raise it together with "
                "train.weight_sync.timeout_s for very large models")

    def setup(self, sender: Any, receivers: Sequence[Any]) -> None:

        super().setup(sender, receivers)
        actors = [sender, *receivers]
        for a in actors:
            if not getattr(a, "_ray_enable_tensor_transport", False):
                raise BackendUnavailableError(
                    f"rdt/{self.backend}: actor {a} was not created with enable_tensor_transport=True; every "
                    "sender AND receiver needs it (otherwise the transfer hangs, ray-project/ray#66264): create "
                    "the class with weight_sync.ray_actor_class(cls, 'rdt') -- ActorClass.options() "
                    "ignores enable_tensor_transport")
        check_backend(self.backend, self._probe(actors))
        self._actor_ids = [a._ray_actor_id for a in actors]
        if self.spec.collective:
            from ray.experimental.collective import create_collective_group

            self._group = create_collective_group(actors, backend=self.backend,
                                                  name=f"rlpipe-weight-sync-{uuid.uuid4().hex[:8]}")

    def _export(self, sender: Any, receivers: Sequence[Any]) -> Any:
        if self._actor_ids is None:
            raise WeightSyncError(f"weight sync {self.label}: call setup(sender, receivers) before sync")
        if sender._ray_actor_id != self._actor_ids[0] or any(
                r._ray_actor_id not in self._actor_ids[1:] for r in receivers):
            # a transfer to an actor outside the collective group would hang
            raise WeightSyncError(f"weight sync {self.label}: sync() got actors that setup() did not see")
        return sender.export_weights.options(tensor_transport=self.spec.ray_name).remote(
            self.spec.export_device, True)  # packed: few large tensors, and a copy, not a view

    def teardown(self) -> None:
        if self._group is None:
            return
        group, self._group = self._group, None
        if self._broken:  # a stuck actor could block the destroy task forever; the run is failing anyway
            log.warning("weight sync %s: not destroying collective group %s after a failed sync",
                        self.label, group.name)
            return
        from ray.experimental.collective import destroy_collective_group

        destroy_collective_group(group)


TRANSPORTS: dict[str, type[Transport]] = {
    "local": LocalTransport,
    "object_store": ObjectStoreTransport,
    "rdt": RdtTransport,
}


def preflight(backend: str) -> None:
    """Driver-side availability check of an rdt backend, before Ray or any actor starts.

    It assumes the actors run on this host (the local-Ray case); ``setup`` repeats the checks
    authoritatively inside the actors. Skip it (``make_transport(cfg, preflight_check=False)``)
    when the driver attaches to a cluster whose GPUs it cannot see."""
    if backend not in RDT_BACKENDS:
        raise ValueError(f"train.weight_sync.backend: {backend!r} is not one of {list(RDT_BACKENDS)}")
    cuda = torch.cuda.is_available()  # an NVML query: creates no CUDA context in the driver
    probe = ActorProbe("the driver process", "cuda:0" if cuda else "cpu", cuda, None, None,
                       importlib.util.find_spec("nixl") is not None,
                       importlib.util.find_spec("cupy") is not None, False)
    RDT_BACKENDS[backend].preflight([probe])
    if backend == "nccl" and torch.cuda.device_count() < 2:
        raise BackendUnavailableError("rdt/nccl needs two GPUs (one per actor) but this host has 1; "
                                      "use rdt/cuda_ipc for actors sharing one GPU")


def sync_backend(cfg: Any) -> str | None:
    """The second half of a ``WeightSyncConfig``'s label: the rdt backend, ``channel`` for an
    object-store channel, else None."""
    if cfg.transport == "rdt":
        return cfg.backend
    return "channel" if cfg.transport == "object_store" and getattr(cfg, "channel", False) else None


def make_transport(cfg: Any, preflight_check: bool = True) -> Transport:
    """The transport for ``cfg`` (a ``WeightSyncConfig``: transport, backend, channel, timeout_s).

    For rdt, ``preflight`` runs first, so an unavailable backend fails before Ray starts."""
    if cfg.transport not in TRANSPORTS:
        raise ValueError(f"train.weight_sync.transport: {cfg.transport!r} is not one of {list(TRANSPORTS)}")
    if sync_backend(cfg) == "channel":
        return ChannelTransport(timeout_s=cfg.timeout_s)
    backend = cfg.backend if cfg.transport == "rdt" else None
    transport = TRANSPORTS[cfg.transport](timeout_s=cfg.timeout_s, backend=backend)
    if cfg.transport == "rdt" and preflight_check:
        preflight(backend)
    return transport
