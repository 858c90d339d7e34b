"""The actor side of weight sync: the ``WeightSender`` / ``WeightReceiver`` mixins and their probes.

The trainer's actor classes inherit one mixin each: ``class Learner(WeightSender)`` and
``class Generator(WeightReceiver)``. Both need ``self.model`` (an ``nn.Module``). The payload is
``flat_weights(model)``: the state dict with tied tensors sent once (a tied embedding / LM head
would otherwise cross twice); non-persistent buffers (e.g. RoPE caches) are not sent because the
receiver computes them itself. ``load_weights`` copies in place into the receiver's existing
tensors (its optimizer-free model keeps its storage, device and dtype) and returns a ``LoadAck``
with the byte count and, on request, a blake2b checksum of the received weights. Make both actor
classes with ``backends.ray_actor_class(cls, cfg.transport)``.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlpipe.trainer.weight_sync.errors import WeightSyncError
from rlpipe.trainer.weight_sync.payload import (
    ShmPayload,
    _load_into,
    _reusable,
    flat_weights,
    pack_weights,
    shm_payload,
    state_bytes,
    weights_checksum,
    wire_dtype,
)

# room for a ShmPayload's pickled names and chunk headers in a channel (~50 bytes per 1 MiB chunk
# measured, so the 1 MiB slack alone covers ~20 GB). A bigger payload makes Ray grow the channel,
# which works on one node only: a reader on another node is busy in its read and cannot answer the
# writer's resize call, so the sync would fail at timeout_s.
CHANNEL_SLACK_PER_TENSOR, CHANNEL_SLACK = 512, 1 << 20

log = logging.getLogger(__name__)


@dataclass
class ActorProbe:
    """What ``setup`` needs to know about an actor before the first transfer."""

    name: str  # class name and pid, for messages
    model_device: str
    cuda_available: bool
    gpu_uuid: str | None  # physical GPU of the model (None on CPU)
    node_id: str | None
    has_nixl: bool
    has_cupy: bool
    is_async: bool  # any ``async def`` method makes Ray run the actor as an async actor


@dataclass
class LoadAck:
    receiver: str
    version: int
    bytes: int
    seconds: float  # in-place copy time on the receiver
    wall_time: float  # time.time() when the new weights were in place (version logging)
    checksum: str | None = None


class _WeightActor:
    """Shared by both mixins: the probe and the checksum."""

    model: nn.Module

    def weight_sync_probe(self) -> ActorProbe:
        dev = next((t.device for t in self.model.state_dict().values()), torch.device("cpu"))
        uuid_ = str(torch.cuda.get_device_properties(dev).uuid) if dev.type == "cuda" else None
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:  # not inside Ray (local transport)
            node = None
        cls = type(self)
        is_async = any(inspect.iscoroutinefunction(getattr(cls, n, None)) for n in dir(cls)
                       if not n.startswith("__"))
        return ActorProbe(f"{cls.__name__}(pid {os.getpid()})", str(dev), torch.cuda.is_available(),
                          uuid_, node, importlib.util.find_spec("nixl") is not None,
                          importlib.util.find_spec("cupy") is not None, is_async)

    def weights_checksum(self) -> str:
        return weights_checksum(self.model)


class WeightSender(_WeightActor):
    """Mixin for the actor that owns the trained weights (the Learner).

    ``weight_sync_dtype``: the receivers' floating weight dtype when it differs from the sender's
    (an fp32 learner's bf16 generator); every export casts floating weights to it, so the bytes that
    cross are the receiver's (half of fp32's for bf16). None: the model's own dtypes.

    Precision: an fp32 learner (master weights under bf16 autocast) may feed a generator with bf16
    weights (an HF policy on CUDA); the ``LearnerWorker`` takes the dtype from
    ``Learner.sync_dtype``. Packed and shared-memory payloads carry raw bytes cut by the receiver's
    layout, so they must be in its dtype: a sender that does not cast is refused by the layout check
    before anything is written. Named tensors (``local``: ``copy_weights``, and named payloads) may
    differ in floating dtype: the receiver's in-place copy rounds them to nearest."""

    weight_sync_dtype: torch.dtype | None = None

    def export_weights(self, device: str | None = "cpu", pack: bool = False) -> dict[str, torch.Tensor]:
        """The flat weights on ``device`` (None: the model's own device), in ``weight_sync_dtype``.

        ``pack=True`` (rdt) returns ``pack_weights``: one buffer per dtype, a copy, so a later
        in-place optimizer step cannot leak into a transfer still in flight: with RDT, Ray keeps a
        *reference* to the returned tensors in the sender until every ObjectRef is gone, so an
        optimizer step that mutated exported parameters in place could be seen by a receiver that
        has not fetched yet. The copy was chosen over calling ``ray.experimental.wait_tensor_freed``
        before each optimizer step: waiting would block the learner's next step on the slowest
        receiver's fetch, coupling the two halves that disaggregation separates, while the copy costs
        one memcpy of the model. ``wait_tensor_freed`` only decides, without blocking (50 ms at
        most, ``_reusable``), whether the previous pack may be refilled instead of allocating (and
        page-faulting) a model-sized buffer per sync: on the dev machine packing 100 MB took ~60 ms
        into fresh memory and ~10 ms into a reused buffer. A pack some ref still points to is never
        touched (tested). Memory: one model-sized pack on the sender (two while an old ref is still
        alive). Without ``pack``, tensors already on ``device`` are the model's own (the object
        store copies them when the task returns)."""
        flat, dtype = flat_weights(self.model), self.weight_sync_dtype
        if not pack:
            return {name: t.detach().to(device or t.device, wire_dtype(t, dtype)) for name, t in flat.items()}
        device = device or next(iter(flat.values())).device
        prev = getattr(self, "_weight_sync_pack", None)
        into = prev if _reusable(prev, flat, device, wait_s=0.05, dtype=dtype) else None
        self._weight_sync_pack = pack_weights(flat, device, into, dtype)
        return self._weight_sync_pack

    def export_weights_shm(self, pack: bool | None = None) -> ShmPayload:
        """The object-store payload (``shm_payload``): ``uint8`` numpy buffers that Ray stores out of
        band, so the receiver reads them from shared memory without a deserialising copy. CPU
        models send views of their own tensors (``pack=None``): Ray copies them into the object
        store when this task returns, before the actor (``max_concurrency=1``) can run an optimizer
        step, so a pack would only add a memcpy (~15 ms per 100 MB on the dev machine, measured as
        ``object_store/packed`` in ``rlpipe bench weight-sync``). Models off the CPU (or
        ``pack=True``) are packed into a CPU buffer that is refilled on every call (one
        device-to-host copy per tensor into warm memory, instead of a fresh CPU tensor each)."""
        payload, self._weight_sync_shm_pack = shm_payload(
            flat_weights(self.model), pack, getattr(self, "_weight_sync_shm_pack", None), self.weight_sync_dtype)
        return payload


    def open_weight_channel(self, key: str, readers: list[tuple[Any, str | None]]) -> Any:
        """Create the Ray shared-memory channel ``key`` (``ChannelTransport``) with this actor as its
        writer and ``readers`` as ``(actor handle, node id)``; returned for the readers to attach."""
        import ray
        from ray.experimental.channel import Channel

        flat = flat_weights(self.model)
        size = state_bytes(flat, self.weight_sync_dtype) + CHANNEL_SLACK_PER_TENSOR * len(flat) + CHANNEL_SLACK
        channel = Channel(ray.get_runtime_context().current_actor, readers, typ=size)
        self._weight_channels = {**getattr(self, "_weight_channels", {}), key: channel}
        return channel

    def write_weight_channel(self, key: str, timeout_s: float) -> int:
        """Write the weights (``shm_payload``: views of CPU tensors, packed off the CPU) into channel
        ``key``: one copy. Waits (at most ``timeout_s``) until every reader is past the last value."""
        payload = self.export_weights_shm()
        self._weight_channels[key].write(payload, timeout=timeout_s)
        return payload.nbytes

    def close_weight_channel(self, key: str) -> None:
        channel = getattr(self, "_weight_channels", {}).pop(key, None)
        if channel is not None:
            channel.close()


class WeightReceiver(_WeightActor):
    """Mixin for actors that receive weights (the Generator). Must be RDT-enabled for rdt."""

    weights_version: int = -1

    def load_weights(self, state: dict[str, torch.Tensor] | ShmPayload, version: int,
                     checksum: bool = False) -> LoadAck:
        t0 = time.perf_counter()
        nbytes = _load_into(flat_weights(self.model), state)
        self.weights_version = version
        seconds = time.perf_counter() - t0
        return LoadAck(f"{type(self).__name__}(pid {os.getpid()})", version, nbytes, seconds, time.time(),
                       weights_checksum(self.model) if checksum else None)

    def attach_weight_channel(self, key: str, channel: Any) -> None:
        """Register as a reader of the channel ``key`` that the sender opened."""
        channel.ensure_registered_as_reader()
        self._weight_channels = {**getattr(self, "_weight_channels", {}), key: channel}

    def read_weight_channel(self, key: str, version: int, checksum: bool = False,
                            timeout_s: float | None = None) -> LoadAck:
        """Wait (at most ``timeout_s``) for the next value of channel ``key`` and load it in place
        (``load_weights``). The value's buffers are read-only views into the channel, valid until
        this reader's next read, which is when the writer may overwrite them."""
        payload = self._weight_channels[key].read(timeout=timeout_s)
        if isinstance(payload, BaseException):  # Ray returns a closed channel's error as the value
            raise WeightSyncError(f"weight channel {key}: {payload}") from payload
        if not isinstance(payload, ShmPayload):
            raise WeightSyncError(f"weight channel {key}: expected a ShmPayload, got {type(payload).__name__}")
        return self.load_weights(payload, version, checksum)
