"""Learner -> generator weight synchronisation behind one small interface.

Config (``train.weight_sync``): ``transport: local | object_store | rdt``, ``backend: gloo | nccl |
nixl | cuda_ipc`` (rdt only), ``channel`` (object_store only) and ``timeout_s``. This package
re-exports its modules' public names; where to look:

- ``transports``: the driver side, what each transport is (its table), ``make_transport`` and the
  ``setup`` / ``sync`` / ``teardown`` life cycle; why the channel is the default
  (``ChannelTransport``), what bounds rdt/gloo on CPU and RDT's limits (``RdtTransport``), how a
  sync is timed and bounded (``_RayTransport``);
- ``actor_side``: the ``WeightSender`` / ``WeightReceiver`` mixins the trainer's actors inherit,
  the precision a sync crosses in (``WeightSender``), why rdt sends a copy
  (``WeightSender.export_weights``);
- ``payload``: flattening, packing, the shared-memory payload and in-place loading;
- ``backends``: each RDT backend's checks, and the actor-class options rdt needs
  (``actor_options``: on the class, for the receiver too);
- ``errors``: ``WeightSyncError`` and its timeout and unavailable-backend kinds.

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
