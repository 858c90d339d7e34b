"""Learner -> generator weight synchronisation behind one small interface.

Config (``train.weight_sync``): ``transport: local | object_store | rdt``, ``backend: gloo | nccl |
nixl | cuda_ipc`` (rdt only), ``channel`` (object_store only) and ``timeout_s``.
``make_transport(cfg)`` picks the class from the ``TRANSPORTS`` dict (``ChannelTransport`` for a
channel) and, for rdt, runs a driver-side ``preflight`` (CUDA present? nixl / cupy importable?) so
that an unavailable backend fails before Ray starts. The driver then calls
``setup(sender, receivers)`` once before training (the authoritative checks, on probes taken
inside the actors: devices, which physical GPU, packages, async methods), ``sync(sender,
receivers, version) -> SyncStats`` after each policy update, and ``teardown()`` at the end.

Transports
==========
=================  ==========================================================================
``local``          in-process copy (``copy_weights``) for the ColocatedWorker, which holds the
                   learner's and the generator's model in one actor.
``object_store``   (the default, ``channel: true``; label ``object_store/channel``) Ray's object
                   store through a shared-memory channel (``ray.experimental.channel``, the
                   reusable mutable objects of Ray Compiled Graphs) that the sender opens at
                   ``setup``: every sync it writes a ``ShmPayload`` (``uint8`` numpy views of its
                   CPU tensors) into that same buffer, and every receiver reads it zero-copy while
                   copying it into its own tensors (``ChannelTransport``).
``object_store``   ``channel: false``: the sender's task returns the ``ShmPayload``, which Ray
                   copies into a fresh object in shared memory every sync.
``rdt/gloo``       Ray Direct Transport over a gloo collective group (CPU tensors): the tensors
                   stay in the sender's process and go sender -> receiver over a socket, with no
                   object-store serialisation. Works on CPU-only machines.
``rdt/nccl``       RDT over NCCL, GPU to GPU, for actors on *separate* GPUs (needs cupy).
``rdt/nixl``       RDT over NIXL (one-sided RDMA, GPU or CPU); needs the ``nixl`` package.
``rdt/cuda_ipc``   RDT over CUDA IPC handles, for two actors sharing *one* GPU.
=================  ==========================================================================

Actor side
==========
The trainer's actor classes inherit one mixin each: ``class Learner(WeightSender)`` and
``class Generator(WeightReceiver)``. Both need ``self.model`` (an ``nn.Module``). The payload is
``flat_weights(model)``: the state dict with tied tensors sent once (a tied embedding / LM head
would otherwise cross twice); non-persistent buffers (e.g. RoPE caches) are not sent because the
receiver computes them itself. ``load_weights`` copies in place into the receiver's existing
tensors (its optimizer-free model keeps its storage, device and dtype) and returns a ``LoadAck``
with the byte count and, on request, a blake2b checksum of the received weights.

Precision: an fp32 learner (master weights under bf16 autocast) may feed a generator with bf16
weights (an HF policy on CUDA). The sender's ``weight_sync_dtype`` (the ``LearnerWorker`` takes it
from ``Learner.sync_dtype``) makes every export cast floating weights to the receiver's dtype, so
bf16 crosses (half the bytes) and packed and shared-memory payloads, which carry raw bytes cut by
the receiver's layout, match it; a sender that does not cast is refused by the layout check before
anything is written. Named tensors (``local``: ``copy_weights``, and named payloads) may differ in
floating dtype: the receiver's in-place copy rounds them to nearest.

Make both actor classes with ``ray_actor_class(cls, cfg.transport)`` (``ray.remote(**actor_options
(transport))(cls)``): for rdt this sets ``enable_tensor_transport=True`` and ``max_concurrency=1``
in the class decorator -- ``ActorClass.options(enable_tensor_transport=True)`` is silently
ignored by Ray 2.60. The RECEIVER needs ``enable_tensor_transport`` too (ray-project/ray#66264:
without it the receiver never starts the background thread that accepts the transfer, and the
task hangs until ``RAY_rdt_fetch_fail_timeout_milliseconds``, 60 s by default); ``setup`` checks
every handle and refuses one that lacks it.

RDT limits honoured here (Ray 2.60 docs, "Limitations"): no async actors (``setup`` probes the
actor classes for ``async def`` methods), ``max_concurrency=1`` for the collective backends (gloo,
nccl: two concurrent transfers on one communicator could interleave), and an actor is in at most
one collective group per backend, so ``setup`` creates the group from the driver over
``[sender, *receivers]`` and ``teardown`` destroys it.

Packing and mutation after send: for rdt the sender exports ``pack_weights`` -- one contiguous
buffer per dtype plus a layout fingerprint -- instead of one tensor per parameter, because RDT
moves each tensor separately (gloo: ~2.7 ms per tensor here; a 52-tensor 5.5 MB model took
142 ms unpacked, 13 ms packed; NCCL/NIXL/IPC also pay per-tensor setup). The receiver cuts the
buffers with its own model's layout after checking the fingerprint. The pack is a copy, which
settles the mutation hazard: with RDT, Ray keeps a *reference* to the returned tensors in the
sender until every ObjectRef is gone, so an optimizer step that mutated exported parameters in
place could be seen by a receiver that has not fetched yet. We chose the copy over calling
``ray.experimental.wait_tensor_freed`` before each optimizer step: waiting would block the
learner's next step on the slowest receiver's fetch, coupling the two halves that disaggregation
separates, while the copy costs one memcpy of the model. ``wait_tensor_freed`` is used only to
decide, without blocking (50 ms at most), whether the previous pack may be refilled instead of
allocating a fresh model-sized buffer (fresh memory is page-faulted: packing 100 MB took ~60 ms
fresh vs ~10 ms reused); a pack some ref still points to is never touched (tested). Memory: one
model-sized pack on the sender (two while an old ref is still alive).

The object store (what follows describes the fresh-object path, ``channel: false``; the channel
sends the same ``ShmPayload`` through its reused buffer): torch tensors returned from a task are
pickled *in band* -- copied into the
object store, then deserialised into fresh tensors on the receiver (page-faulted), then copied
into the model: 100 MB took ~330-440 ms on the 2-core dev machine. A ``ShmPayload`` instead holds
``uint8`` numpy arrays, which Ray's pickle5 serialiser stores out of band: the receiver gets
read-only views into the object store's shared memory (no deserialising copy; tested) and copies
from them straight into its tensors: ~50 ms for 100 MB at load average ~2 (two memcpys plus Ray's
fixed ~10 ms), ~90 ms with the 2 cores 2-3x oversubscribed by other processes. A
CPU model sends views of its own tensors, not a pack: Ray copies the return value into the object
store when the task returns -- before an actor with ``max_concurrency=1`` can run an optimizer
step -- so a pack would only add a memcpy (~15 ms per 100 MB here, measured as
``object_store/packed`` in ``rlpipe bench weight-sync``). A model off the CPU is packed per dtype
into a CPU buffer refilled on every sync (one device-to-host copy per tensor into warm memory,
instead of a fresh CPU tensor each); the receiver checks the layout fingerprint either way, since
the bytes carry no dtype or shape. ``ObjectStoreTransport(payload="tensors")`` keeps the naive
path for comparison.

Two costs beyond the two copies, and what removes them (100 MB, 2 cores, Ray 2.60; ``rlpipe bench
weight-sync``). (1) Ray copies each out-of-band buffer above 1 MiB with a parallel memcpy that
starts 6 threads per buffer: a 100 MB model in 4 MiB tensors took ~17 ms to write instead of one
memcpy's ~10 ms. ``ShmPayload`` therefore cuts every buffer into 1 MiB views (``SHM_CHUNK_BYTES``),
which Ray copies with a plain memcpy, and the receiver copies chunk by chunk into its tensors.
(2) A fresh object per sync lands in object-store pages the sender has to fault in again; the
channel writes into the same mapped buffer every time. Measured: fresh object ~30-34 ms (0.30-0.33
of the in-run memcpy), channel ~25-28 ms (0.36-0.42); two memcpys are ~21 ms. The channel's write
waits until every reader has moved past the previous value, and a reader moves past it only by
starting its next read; so ``sync`` submits the write and the reads together. The drivers sync
only while both actors are idle, so the wait couples nothing. Multi-node readers get the value
pushed by Ray (one buffer per node). The channel is the default because it was faster at every
payload of the bench's sweep on the dev machine (one run, load ~1: the pipeline's 5 MB model 7.0
vs 9.9 ms, 1 MB 3.8 vs 5.4 ms, 100 MB 31 vs 39 ms, 1 GB 263 vs 334 ms).

What bounds rdt/gloo on CPU (100 MB, 2 cores, one torch thread per actor, Ray 2.60): ~190 ms per
sync = pack ~18 ms (a warm memcpy; the pack is reused) + the transfer ~50 ms + ~60 ms of page
faults in the receive buffer + the in-place load ~18 ms + ~45 ms of Ray round trips (export task,
metadata to the driver, ``__ray_send__``/``__ray_recv__`` tasks, the load task; ~16 ms at 1 MB).
Per-tensor overhead is gone (packed). Socket buffers are not the limit: gloo over loopback TCP
moves 100 MB between two warm buffers in ~45 ms (~2.2 GB/s, about half a memcpy, as every byte is
copied into and out of the kernel), and fixed ``SO_SNDBUF``/``SO_RCVBUF`` sizes were slower than
Linux's autotuning in a loopback probe. Threads: gloo sends and receives on one thread each, and
both actors keep a core busy during the transfer, so more threads cannot help on 2 cores. The page
faults are Ray's: for two-sided transports (gloo, nccl) it allocates a fresh ``torch.empty``
receive buffer per transfer, and ``set_target_for_ref`` (receive into our own buffer) only works
for one-sided transports fetched with ``ray.get``. Setting ``THP_MEM_ALLOC_ENABLE=1`` in the
actors' environment (torch then requests transparent huge pages for large CPU allocations)
removed those faults in a probe (fresh receive 109 -> 48 ms, sync ~190 -> ~120 ms); it is a
process-wide memory policy, so it is left to the run's Ray ``runtime_env`` (``rlpipe bench
weight-sync --thp`` measures it). Even then the object store wins on CPU: fewer copies, fewer
round trips. RDT's advantage needs GPUs (NCCL, CUDA IPC, NIXL), which this CPU machine cannot
measure.

On one device (the colocated worker's ``local`` copy, a packed ``rdt/cuda_ipc`` payload, the
sender's pack) every tensor moves in one fused call, ``torch._foreach_copy_`` (``payload.copy_all``):
on a GPU a few multi-tensor kernels for the whole model, with no per-tensor launch from Python,
no host round trip and no CPU staging. It is not one ``copy_`` into a flat buffer re-pointed as the
receiver's storage, because the receiver's tensors must keep their storage (see below).

Timing and failures: every sync is timed on the driver (``SyncStats.seconds``: from submitting
the export to the last receiver's ack), logged with bytes and GB/s (decimal, bytes moved to all
receivers / seconds), and bounded by ``ray.get(..., timeout=timeout_s)``; a timeout raises
``WeightSyncTimeout`` naming transport/backend, ``train.weight_sync.timeout_s`` and, for rdt, the
``RAY_rdt_fetch_fail_timeout_milliseconds`` knob.

Departures from the seeds: seed 000 §3.4 uses NCCL and seed 002 Problem 12 uses NIXL with
``@ray.method(tensor_transport=...)`` hard-coded on ``Learner.get_weights`` returning
``state_dict()``. Here the backend is chosen per call with ``.options(tensor_transport=...)`` so one
actor class serves every transport from config; gloo is added so that RDT runs (and is tested) on
CPU-only machines; tied weights are de-duplicated; rdt payloads are packed; object-store
payloads are shared-memory views read without a deserialising copy; and the receiver copies in
place instead of ``load_state_dict`` so the generator's tensors (and any CUDA graphs or KV caches
pointing at them) keep their storage.
"""

from __future__ import annotations

from rlpipe.trainer.weight_sync.actor_side import (
    ActorProbe,
    LoadAck,
    WeightReceiver,
    WeightSender,
)
from rlpipe.trainer.weight_sync.backends import (
    RDT_BACKENDS,
    RdtBackend,
    actor_options,
    check_backend,
    ray_actor_class,
)
from rlpipe.trainer.weight_sync.errors import (
    RDT_TIMEOUT_ENV,
    BackendUnavailableError,
    WeightSyncError,
    WeightSyncTimeout,
)
from rlpipe.trainer.weight_sync.payload import (
    LAYOUT_KEY,
    ShmPayload,
    SyncStats,
    copy_weights,
    flat_weights,
    layout_fingerprint,
    pack_weights,
    shm_payload,
    state_bytes,
    weights_checksum,
)
from rlpipe.trainer.weight_sync.transports import (
    OBJECT_STORE_PAYLOADS,
    TRANSPORTS,
    ChannelTransport,
    LocalTransport,
    ObjectStoreTransport,
    RdtTransport,
    Transport,
    make_transport,
    preflight,
    sync_backend,
)

__all__ = [
    "ActorProbe",
    "BackendUnavailableError",
    "ChannelTransport",
    "LAYOUT_KEY",
    "LoadAck",
    "LocalTransport",
    "OBJECT_STORE_PAYLOADS",
    "ObjectStoreTransport",
    "RDT_BACKENDS",
    "RDT_TIMEOUT_ENV",
    "RdtBackend",
    "RdtTransport",
    "ShmPayload",
    "SyncStats",
    "TRANSPORTS",
    "Transport",
    "WeightReceiver",
    "WeightSender",
    "WeightSyncError",
    "WeightSyncTimeout",
    "actor_options",
    "check_backend",
    "copy_weights",
    "flat_weights",
    "layout_fingerprint",
    "make_transport",
    "pack_weights",
    "preflight",
    "ray_actor_class",
    "shm_payload",
    "state_bytes",
    "sync_backend",
    "weights_checksum",
]
