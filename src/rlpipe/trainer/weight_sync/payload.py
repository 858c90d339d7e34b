"""Weight payloads: flattening, packing into one buffer per dtype, shared-memory (object store)
payloads, in-place loading, checksums, sync stats. Why each form: ``pack_weights`` (rdt),
``ShmPayload`` and ``SHM_CHUNK_BYTES`` (the object store), ``copy_all`` (one device)."""

from __future__ import annotations

import hashlib
import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rlpipe.trainer.weight_sync.errors import WeightSyncError

log = logging.getLogger(__name__)


def _plain(mod: nn.Module) -> bool:
    """Whether ``mod``'s own state-dict entries are exactly its parameters and persistent buffers
    (no override, hook or extra state)."""
    cls = type(mod)
    return (cls.state_dict is nn.Module.state_dict and cls._save_to_state_dict is nn.Module._save_to_state_dict
            and getattr(cls, "get_extra_state", nn.Module.get_extra_state) is nn.Module.get_extra_state
            and not mod._state_dict_hooks and not mod._state_dict_pre_hooks)


def _state_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()``: the same names, order and detached tensors, read straight from each
    submodule's parameters and persistent buffers (pre-order, as ``state_dict`` recurses) without
    its per-module machinery, which cost more than the copy itself in a same-GPU sync of a model of
    hundreds of tensors. A module that customises its state dict gets the real ``state_dict()``."""
    out: dict[str, torch.Tensor] = {}
    for prefix, mod in module.named_modules(remove_duplicate=False):
        if not _plain(mod):
            return module.state_dict()
        pre = f"{prefix}." if prefix else ""
        for name, t in mod._parameters.items():
            if t is not None:
                out[pre + name] = t.detach()
        skip = mod._non_persistent_buffers_set
        for name, t in mod._buffers.items():
            if t is not None and name not in skip:
                out[pre + name] = t.detach()
    return out


def flat_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict with tensors that share storage (tied weights) listed once."""
    seen: set[tuple] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in _state_tensors(module).items():
        if t.numel() > 0:  # empty tensors may all report data_ptr 0: never treat them as tied
            key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                   tuple(t.stride()), t.dtype)
            if key in seen:
                continue
            seen.add(key)
        out[name] = t
    return out


def wire_dtype(t: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype ``t`` crosses a sync in: ``dtype`` for a floating tensor when one is given (the
    receiver's weight dtype: an fp32 learner's bf16 generator), else its own."""
    return dtype if dtype is not None and t.is_floating_point() else t.dtype


def as_wire(flat: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """``flat`` with every floating tensor in ``dtype`` (a copy where it differs; unchanged for None)."""
    if dtype is None:
        return flat
    return {name: t.to(wire_dtype(t, dtype)) for name, t in flat.items()}


def _flat(t: torch.Tensor) -> torch.Tensor:
    """(numel,) view of a contiguous tensor with unit stride. ``reshape(-1)`` would keep a 1-element
    tensor's odd stride (``x[0:1, 0]`` is contiguous with stride 4), which ``view(torch.uint8)``
    refuses."""
    return t.as_strided((t.numel(),), (1,))


def state_bytes(state: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> int:
    """Bytes of ``state``, with floating tensors counted in ``dtype`` when given (``wire_dtype``)."""
    return sum(t.numel() * wire_dtype(t, dtype).itemsize for t in state.values())


def weights_checksum(state: dict[str, torch.Tensor] | nn.Module) -> str:
    """blake2b over names, dtypes, shapes and raw bytes: equal iff the weights are bit-identical."""
    if isinstance(state, nn.Module):
        state = flat_weights(state)
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(state):
        t = state[name].detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(_flat(t.contiguous()).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


LAYOUT_KEY = "__layout__"  # in a packed payload: (1,) int64 fingerprint of names/dtypes/shapes


def layout_fingerprint(flat: dict[str, torch.Tensor], device: torch.device | str = "cpu",
                       dtype: torch.dtype | None = None) -> torch.Tensor:
    """(1,) int64 hash of the names, dtypes (``wire_dtype``) and shapes in order: a packed payload
    carries no names, so sender and receiver prove with this that they cut the buffers the same way."""
    h = hashlib.blake2b(digest_size=8)
    for name, t in flat.items():
        h.update(f"{name}|{wire_dtype(t, dtype)}|{tuple(t.shape)};".encode())
    return torch.tensor([int.from_bytes(h.digest(), "little", signed=True)], dtype=torch.int64, device=device)


def pack_weights(flat: dict[str, torch.Tensor], device: torch.device | str, into: dict[str, torch.Tensor] | None = None,
                 dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """One contiguous 1-D buffer per dtype (in ``flat`` order) on ``device``, plus the layout;
    floating tensors are cast to ``dtype`` by the copy when one is given (``wire_dtype``).

    A copy, never a view of the model; ``into`` (a previous pack of the same layout that no
    transfer references any more) is refilled instead of allocating. RDT moves each tensor
    separately, and gloo costs ~2.7 ms per tensor on the 2-core dev machine: a 52-tensor 5.5 MB
    model took 142 ms unpacked and 13 ms packed (NCCL, NIXL and CUDA IPC also pay a per-tensor
    set-up). The receiver cuts the buffers with its own model's layout after checking the
    fingerprint (``_unpack``)."""
    sizes: dict[torch.dtype, int] = {}
    for t in flat.values():
        sizes[wire_dtype(t, dtype)] = sizes.get(wire_dtype(t, dtype), 0) + t.numel()
    if into is not None:
        bufs = {dt: into[str(dt)] for dt in sizes}
    else:
        bufs = {dt: torch.empty(n, dtype=dt, device=device) for dt, n in sizes.items()}
    offsets, dst, src = dict.fromkeys(sizes, 0), [], []
    for t in flat.values():
        wire = wire_dtype(t, dtype)
        o, n = offsets[wire], t.numel()
        dst.append(bufs[wire][o:o + n])
        src.append(t.detach().reshape(-1))
        offsets[wire] = o + n
    copy_all(dst, src)  # one fused copy (casting where the dtypes differ); on device when the pack is there
    out = {str(dt): b for dt, b in bufs.items()}  # keys like "torch.float32"
    out[LAYOUT_KEY] = into[LAYOUT_KEY] if into is not None else layout_fingerprint(flat, device, dtype)
    return out


# Ray's serialiser copies every out-of-band buffer larger than 1 MiB (kMemcopyDefaultThreshold)
# with a parallel memcpy that starts its threads per buffer: on the 2-core dev machine a 100 MB
# write cost ~17 ms in 4 MiB tensors, ~11 ms in 1 MiB chunks (one memcpy, ~10 ms). So every
# buffer is cut into chunks of at most this many bytes (views, no copy).
SHM_CHUNK_BYTES = 1 << 20


@dataclass
class ShmPayload:
    """An object-store payload that Ray keeps in shared memory and hands to the receiver without a
    copy: every buffer is a tuple of 1-D ``uint8`` numpy arrays (chunks of at most
    ``SHM_CHUNK_BYTES``, in order), which Ray's pickle5 serialiser stores out of band, so the
    receiver gets read-only views into the object store (plasma) and copies from them straight into
    its own tensors. Torch tensors would instead be pickled in band: a copy into the object store,
    a deserialising copy on the receiver, per tensor, plus the in-place load.

    ``packed=False``: one buffer per tensor, keyed by name, each a *view* of the sender's CPU
    tensor, so the only sender-side copy is Ray's into shared memory when the task returns.
    ``packed=True``: ``pack_weights`` buffers keyed by dtype (``"torch.float32"``), in a reused CPU
    buffer: for models off the CPU, where a view is impossible and one copy into warm memory beats
    a fresh CPU tensor per parameter. ``layout`` is ``layout_fingerprint`` of the sender's flat
    weights; the bytes carry no dtype or shape, so the receiver checks it before reading them."""

    layout: int
    packed: bool
    buffers: dict[str, tuple[np.ndarray, ...]]

    @property
    def nbytes(self) -> int:
        return sum(int(c.nbytes) for chunks in self.buffers.values() for c in chunks)


def _bytes_view(t: torch.Tensor) -> tuple[np.ndarray, ...]:
    """``uint8`` numpy views of a CPU tensor's bytes in chunks of at most ``SHM_CHUNK_BYTES`` (a
    copy only off the CPU or if not contiguous); an empty tensor gives one empty chunk."""
    b = _flat(t.detach().cpu().contiguous()).view(torch.uint8).numpy()
    return tuple(b[i:i + SHM_CHUNK_BYTES] for i in range(0, len(b), SHM_CHUNK_BYTES)) or (b,)


def shm_payload(flat: dict[str, torch.Tensor], pack: bool | None = None,
                into: dict[str, torch.Tensor] | None = None,
                dtype: torch.dtype | None = None) -> tuple[ShmPayload, dict[str, torch.Tensor] | None]:
    """``(payload, pack)`` for the object store. ``pack=None`` packs only when some tensor is off the
    CPU; otherwise the buffers are views of ``flat`` (of a cast copy where ``dtype``, the receiver's
    floating dtype, differs: ``wire_dtype``). ``into``: the previous pack, refilled when its
    layout matches (always safe: Ray copies a task's return value into the object store before the
    task returns, and a channel write copies before it returns, so nothing references the pack
    afterwards). Returns the pack to keep for reuse."""
    layout = layout_fingerprint(flat, dtype=dtype)
    if pack is None:
        pack = any(t.device.type != "cpu" for t in flat.values())
    if not pack:
        views = {n: _bytes_view(t) for n, t in as_wire(flat, dtype).items()}
        return ShmPayload(int(layout.item()), False, views), None
    if into is not None and int(into[LAYOUT_KEY].item()) != int(layout.item()):
        into = None
    packed = pack_weights(flat, "cpu", into, dtype)
    bufs = {k: _bytes_view(b) for k, b in packed.items() if k != LAYOUT_KEY}
    return ShmPayload(int(layout.item()), True, bufs), packed


def _copy_stream(chunks: tuple[np.ndarray, ...], targets: list[torch.Tensor], what: str) -> None:
    """Copy the bytes of ``chunks`` (in order) into ``targets`` (in order, each filled in place);
    the two byte counts must be equal."""
    with warnings.catch_warnings():
        # Ray's views into the object store are read-only; they are only ever read (copy_ sources)
        warnings.filterwarnings("ignore", message=".*not writable", category=UserWarning)
        srcs = [torch.from_numpy(c) for c in chunks if c.nbytes]
    have, need = sum(c.numel() for c in srcs), sum(t.numel() * t.element_size() for t in targets)
    if have != need:
        raise WeightSyncError(f"shared-memory weights {what!r}: {have} bytes received, the model has {need}")
    k, off = 0, 0
    with torch.no_grad():
        for t in targets:
            flat = _flat(t) if t.is_contiguous() else torch.empty(t.numel(), dtype=t.dtype, device=t.device)
            dst = flat.view(torch.uint8) if flat.numel() else flat
            pos = 0
            while pos < dst.numel():
                n = min(srcs[k].numel() - off, dst.numel() - pos)
                dst[pos:pos + n].copy_(srcs[k][off:off + n])
                pos, off = pos + n, off + n
                if off == srcs[k].numel():
                    k, off = k + 1, 0
            if not t.is_contiguous():
                t.copy_(flat.view(t.shape))


def _load_shm(dst: dict[str, torch.Tensor], payload: ShmPayload) -> int:
    """Copy a ``ShmPayload`` into ``dst`` in place, chunk by chunk (after the layout check): per
    name, or per dtype stream in ``dst`` order when packed. Returns the payload bytes."""
    if payload.layout != int(layout_fingerprint(dst).item()):
        raise WeightSyncError("shared-memory weights have another layout than the receiver's model (names, dtypes "
                              "or shapes differ): sender and receiver must build the same architecture")
    if payload.packed:
        streams = {k: [d for d in dst.values() if str(d.dtype) == k] for k in payload.buffers}
        missing = {str(d.dtype) for d in dst.values()} - set(streams)
    else:
        streams = {n: [d] for n, d in dst.items() if n in payload.buffers}
        missing = dst.keys() - payload.buffers.keys()
    if missing:
        raise WeightSyncError(f"shared-memory weights lack {sorted(missing)[:5]}")
    for key, targets in streams.items():
        _copy_stream(payload.buffers[key], targets, key)
    if any(d.is_cuda for d in dst.values()):
        torch.cuda.synchronize()
    return payload.nbytes


def _reusable(payload: dict[str, torch.Tensor] | None, flat: dict[str, torch.Tensor], device: Any,
              wait_s: float, dtype: torch.dtype | None = None) -> bool:
    """Whether a previous RDT pack may be refilled: same layout (in the wire ``dtype``) and device,
    and Ray has released it (every ObjectRef gone, ``wait_tensor_freed``), so no receiver can still
    be reading it."""
    if payload is None or payload[LAYOUT_KEY].device != torch.device(device):
        return False
    if int(payload[LAYOUT_KEY].item()) != int(layout_fingerprint(flat, dtype=dtype).item()):
        return False
    import ray

    if not ray.is_initialized():  # called outside Ray: the caller may still hold the last pack
        return False
    from ray.experimental import wait_tensor_freed

    try:
        for t in payload.values():
            wait_tensor_freed(t, timeout=wait_s)
    except TimeoutError:
        return False
    return True


def _unpack(dst: dict[str, torch.Tensor], payload: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Views of a packed payload shaped like ``dst`` (after checking the layout fingerprint)."""
    if int(payload[LAYOUT_KEY].item()) != int(layout_fingerprint(dst).item()):
        raise WeightSyncError("packed weights have another layout than the receiver's model (names, dtypes or "
                              "shapes differ): sender and receiver must build the same architecture")
    offsets: dict[str, int] = {}
    out = {}
    for name, d in dst.items():
        key = str(d.dtype)
        o, n = offsets.get(key, 0), d.numel()
        out[name] = payload[key][o:o + n].view(d.shape)
        offsets[key] = o + n
    return out


def _load_into(dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor] | ShmPayload) -> int:
    """Copy ``src`` (named tensors, a ``pack_weights`` payload or a ``ShmPayload``) into ``dst`` in
    place; names and shapes must match exactly. Named tensors may differ from ``dst`` in floating
    dtype (an fp32 learner into a bf16 generator: the copy casts, rounding to nearest); packed and
    shared-memory payloads carry raw bytes, so their sender casts to the receiver's dtypes
    (``pack_weights(dtype=)``) and the layout check refuses any other. Returns the payload bytes."""
    if isinstance(src, ShmPayload):
        return _load_shm(dst, src)
    nbytes = state_bytes({k: v for k, v in src.items() if k != LAYOUT_KEY})
    if LAYOUT_KEY in src:
        src = _unpack(dst, src)
    if dst.keys() != src.keys():
        missing, extra = sorted(dst.keys() - src.keys()), sorted(src.keys() - dst.keys())
        raise WeightSyncError(f"received weights do not match the receiver's model: missing {missing[:5]}, "
                              f"unexpected {extra[:5]}")
    for name, d in dst.items():  # every check before the first byte moves: no half-loaded model
        s = src[name]
        if s.shape != d.shape or (s.dtype != d.dtype and not (s.is_floating_point() and d.is_floating_point())):
            raise WeightSyncError(f"weight {name!r}: received {s.dtype}{tuple(s.shape)}, "
                                  f"model has {d.dtype}{tuple(d.shape)}")
    copy_all(list(dst.values()), [src[name] for name in dst])
    if any(d.is_cuda for d in dst.values()):
        torch.cuda.synchronize()  # the ack's timing is real, and IPC/NCCL buffers may be released
    return nbytes


def copy_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for every i in one fused call (``torch._foreach_copy_``): on one
    GPU that is a few multi-tensor kernel launches for the whole model, asynchronous, with no
    host round trip and no CPU staging (a Python ``copy_`` per tensor costs a launch and an
    interpreter round each, which bounds small-tensor models far below the chip's copy rate).
    The receiver's tensors stay where they are, so CUDA graphs and caches that point at them stay
    valid; that is why this is not a single ``copy_`` into a flat buffer re-pointed as the
    model's storage. Across devices (a GPU model packed into a CPU buffer, or loaded from one) the
    copies go one by one."""
    with torch.no_grad():
        if len({t.device for t in dst} | {t.device for t in src}) <= 1:
            torch._foreach_copy_(dst, src)
        else:
            for d, s in zip(dst, src, strict=True):
                d.copy_(s)


@dataclass
class SyncStats:
    """One weight sync, measured on the driver (``copy_weights``: in-process)."""

    transport: str  # local | object_store | rdt
    backend: str | None  # rdt backend, None otherwise
    version: int  # policy version the receivers hold afterwards
    bytes: int  # payload bytes per receiver
    num_receivers: int
    seconds: float  # wall time of the whole sync: export + transfer + in-place load + acks
    gbps: float  # bytes * num_receivers / seconds / 1e9
    start_time: float  # time.time() wall clock
    end_time: float
    checksums: list[str] | None = None  # receivers' checksums, when requested

    @property
    def label(self) -> str:
        return self.transport if self.backend is None else f"{self.transport}/{self.backend}"

    def metrics(self) -> dict[str, float]:
        """The run's ``sync/*`` metric columns (``rlpipe.trainer.run_writer``)."""
        return {"sync/bytes": float(self.bytes), "sync/seconds": self.seconds, "sync/gbps": self.gbps}


def _stats(transport: str, backend: str | None, version: int, nbytes: int, n: int, start: float,
           t0: float, checksums: list[str] | None = None) -> SyncStats:
    seconds = time.perf_counter() - t0
    stats = SyncStats(transport, backend, version, nbytes, n, seconds,
                      nbytes * n / max(seconds, 1e-12) / 1e9, start, start + seconds, checksums)
    log.info("weight sync %s v%d: %.1f MB x %d in %.4f s (%.2f GB/s)", stats.label, version,
             nbytes / 1e6, n, seconds, stats.gbps)
    return stats


def copy_weights(src: nn.Module, dst: nn.Module, version: int = -1) -> SyncStats:
    """In-process weight copy ``src -> dst`` (the ColocatedWorker's sync), timed, bytes counted."""
    start, t0 = time.time(), time.perf_counter()
    nbytes = _load_into(flat_weights(dst), flat_weights(src))
    return _stats("local", None, version, nbytes, 1, start, t0)
