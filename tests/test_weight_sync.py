"""Weight-sync transports: bit-identical weights after a sync, bounded waits, start-up checks."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from rlpipe.config import WeightSyncConfig
from rlpipe.trainer.weight_sync import (
    TRANSPORTS,
    ActorProbe,
    BackendUnavailableError,
    ChannelTransport,
    LocalTransport,
    ObjectStoreTransport,
    RdtTransport,
    ShmPayload,
    WeightReceiver,
    WeightSender,
    WeightSyncError,
    WeightSyncTimeout,
    actor_options,
    check_backend,
    copy_weights,
    flat_weights,
    make_transport,
    ray_actor_class,
    weights_checksum,
)


class TiedNet(nn.Module):
    """Small model with a tied embedding / output matrix and a non-persistent buffer."""

    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(50, 16)
        self.mid = nn.Linear(16, 16)
        self.out = nn.Linear(16, 50, bias=False)
        self.out.weight = self.emb.weight
        self.register_buffer("steps", torch.tensor(seed, dtype=torch.int64))
        self.register_buffer("cache", torch.zeros(4), persistent=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))


def _equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --------------------------------------------------------------------------- no Ray


def test_flat_weights_sends_tied_tensors_once_and_skips_non_persistent():
    names = list(flat_weights(TiedNet(0)))
    # out.weight is emb.weight: 50*16 floats cross once, not twice
    assert names == ["steps", "emb.weight", "mid.weight", "mid.bias"]  # own buffers come first


def test_copy_weights_is_bit_identical_and_counts_bytes():
    src, dst = TiedNet(1), TiedNet(2)
    assert not _equal(src, dst)
    stats = copy_weights(src, dst, version=3)
    assert _equal(src, dst)
    assert dst.out.weight.data_ptr() == dst.emb.weight.data_ptr()  # tying kept: in-place copy
    assert stats.bytes == (50 * 16 + 16 * 16 + 16) * 4 + 8  # hand-counted: fp32 params + int64 buffer
    assert (stats.transport, stats.backend, stats.version) == ("local", None, 3)
    assert stats.gbps > 0 and stats.end_time >= stats.start_time


def test_local_transport_sets_receiver_version_and_checksums():
    class Gen(WeightReceiver):
        def __init__(self):
            self.model = TiedNet(5)

    class Learn(WeightSender):
        def __init__(self):
            self.model = TiedNet(6)

    learner, gen = Learn(), Gen()
    with make_transport(WeightSyncConfig(transport="local", timeout_s=5)) as t:
        assert isinstance(t, LocalTransport)
        t.setup(learner, [gen])
        stats = t.sync(learner, [gen], version=7, checksum=True)
    assert gen.weights_version == 7 and _equal(learner.model, gen.model)
    assert stats.checksums == [learner.weights_checksum()]


def test_local_transport_rejects_actor_handles():
    with pytest.raises(BackendUnavailableError, match="object_store or rdt"):
        LocalTransport(timeout_s=1).setup(object(), [object()])


def test_packed_payload_round_trips_mixed_dtypes_and_is_a_copy():
    class Learn(WeightSender):
        model = TiedNet(3)

    class Gen(WeightReceiver):
        model = TiedNet(4)

    payload = Learn().export_weights("cpu", pack=True)
    # one buffer per dtype: 50*16 + 16*16 + 16 fp32 values, the int64 buffer, the layout hash
    assert {k: v.numel() for k, v in payload.items()} == {
        "torch.int64": 1, "torch.float32": 1072, "__layout__": 1}
    expected = weights_checksum(Learn.model)
    with torch.no_grad():
        Learn.model.mid.bias.add_(1.0)  # an optimizer step after the export must not leak in
    ack = Gen().load_weights(payload, version=4, checksum=True)
    assert ack.checksum == expected and ack.bytes == 1072 * 4 + 8
    assert Gen.model.out.weight.data_ptr() == Gen.model.emb.weight.data_ptr()


def test_packed_payload_with_another_layout_is_refused():
    class Gen(WeightReceiver):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))

    class Learn(WeightSender):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, bias=False), nn.Linear(1, 2))  # same numel

    assert sum(t.numel() for t in Learn.model.state_dict().values()) == 40
    with pytest.raises(RuntimeError, match="another layout"):
        Gen().load_weights(Learn().export_weights(pack=True), version=1)


def test_checksum_detects_a_one_ulp_change():
    m = TiedNet(0)
    before = weights_checksum(m)
    with torch.no_grad():
        m.mid.bias[0] = torch.nextafter(m.mid.bias[0], torch.tensor(1e9))
    assert weights_checksum(m) != before


def test_load_weights_rejects_shape_mismatch_naming_the_key():
    class Gen(WeightReceiver):
        model = nn.Linear(3, 2)

    with pytest.raises(RuntimeError, match="'weight'"):
        Gen().load_weights({"weight": torch.zeros(2, 4), "bias": torch.zeros(2)}, version=1)


def _probe(**kw) -> ActorProbe:
    base = dict(name="Gen(pid 1)", model_device="cpu", cuda_available=False, gpu_uuid=None, node_id="n",
                has_nixl=False, has_cupy=False, is_async=False)
    return ActorProbe(**{**base, **kw})


@pytest.mark.parametrize("backend,advice", [
    ("nccl", "use rdt/gloo or object_store"),
    ("cuda_ipc", "use rdt/gloo or object_store"),
    ("nixl", "pip install nixl or use rdt/nccl"),
])
def test_unavailable_backends_give_advice(backend, advice):
    with pytest.raises(BackendUnavailableError, match=advice):
        check_backend(backend, [_probe(), _probe()])


def test_gpu_backend_placement_rules():
    gpu = dict(model_device="cuda:0", cuda_available=True, has_cupy=True)
    check_backend("nccl", [_probe(gpu_uuid="A", **gpu), _probe(gpu_uuid="B", **gpu)])
    check_backend("cuda_ipc", [_probe(gpu_uuid="A", **gpu), _probe(gpu_uuid="A", **gpu)])
    with pytest.raises(BackendUnavailableError, match="rdt/cuda_ipc for actors sharing one GPU"):
        check_backend("nccl", [_probe(gpu_uuid="A", **gpu), _probe(gpu_uuid="A", **gpu)])
    with pytest.raises(BackendUnavailableError, match="use rdt/nccl"):
        check_backend("cuda_ipc", [_probe(gpu_uuid="A", **gpu), _probe(gpu_uuid="B", **gpu)])
    with pytest.raises(BackendUnavailableError, match="async"):
        check_backend("gloo", [_probe(is_async=True)])


def test_preflight_on_this_host():
    if torch.cuda.is_available():
        pytest.skip("CUDA present: this checks the CPU-only failure")
    for backend in ("nccl", "cuda_ipc"):
        with pytest.raises(BackendUnavailableError, match="use rdt/gloo or object_store"):
            make_transport(WeightSyncConfig(transport="rdt", backend=backend, timeout_s=1))
    make_transport(WeightSyncConfig(transport="rdt", backend="gloo", timeout_s=1))  # always available


def test_registry_and_options():
    assert set(TRANSPORTS) == {"local", "object_store", "rdt"}
    fresh = make_transport(WeightSyncConfig(transport="object_store", channel=False, timeout_s=1))
    assert type(fresh) is ObjectStoreTransport and fresh.payload == "shared" and fresh.label == "object_store"
    channel = make_transport(WeightSyncConfig(transport="object_store", timeout_s=1))  # the default
    assert isinstance(channel, ChannelTransport) and channel.label == "object_store/channel"
    assert type(make_transport(WeightSyncConfig(transport="rdt", timeout_s=1))) is RdtTransport  # default ignored
    with pytest.raises(ValueError, match="payload"):
        ObjectStoreTransport(1, payload="pickle")
    assert actor_options("rdt") == {"enable_tensor_transport": True, "max_concurrency": 1}
    assert actor_options("object_store") == {}
    with pytest.raises(ValueError, match="backend"):
        make_transport(WeightSyncConfig(transport="rdt", backend="tcp", timeout_s=1))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Ray


class Learner(WeightSender):
    def __init__(self):
        self.model = TiedNet(11)

    def step(self):  # an in-place "optimizer step" after the export
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(1.0)


class Generator(WeightReceiver):
    def __init__(self):
        self.model = TiedNet(22)
        self.seen: tuple[str, list[bool]] = ("", [])

    def state(self):
        return self.model.state_dict()

    def pointers(self):
        return {k: v.data_ptr() for k, v in self.model.state_dict().items()}

    def load_weights(self, state, version, checksum=False):
        bufs = [c for b in state.buffers.values() for c in b] if isinstance(state, ShmPayload) else []
        self.seen = (type(state).__name__, [bool(b.flags.writeable) for b in bufs])
        self.addresses = [b.ctypes.data for b in bufs]
        return super().load_weights(state, version, checksum)

    def last_payload(self):
        return self.seen

    def last_addresses(self):
        return self.addresses


class BigLearner(Learner):
    def __init__(self):
        torch.manual_seed(1)
        self.model = nn.Linear(512, 512)


class BigGen(Generator):
    def __init__(self):
        super().__init__()
        self.model = nn.Linear(512, 512)


class Stuck(WeightReceiver):
    def __init__(self):
        self.model = TiedNet(33)

    def load_weights(self, state, version, checksum=False):
        time.sleep(8)


@pytest.fixture(scope="module")
def actors(ray_session):
    """Actors on the suite's shared Ray instance (conftest.ray_session), killed after the module."""
    import sys

    import ray
    from ray import cloudpickle

    # workers cannot import this test module by name: ship its classes (TiedNet, actors) by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

    def actor(cls):
        return ray_actor_class(cls, "rdt").options(num_cpus=0).remote()

    handles = {"learner": actor(Learner), "gen": actor(Generator), "stuck": actor(Stuck)}
    yield handles
    for h in handles.values():
        ray.kill(h)


TRANSPORT_CASES = {  # every path the trainer or the bench can take on CPU
    "object_store": lambda: make_transport(WeightSyncConfig(transport="object_store", channel=False, timeout_s=60)),
    "object_store-packed": lambda: ObjectStoreTransport(60, payload="packed"),
    "object_store-tensors": lambda: ObjectStoreTransport(60, payload="tensors"),
    "object_store-channel": lambda: make_transport(WeightSyncConfig(transport="object_store", timeout_s=60)),
    "rdt-gloo": lambda: make_transport(WeightSyncConfig(transport="rdt", backend="gloo", timeout_s=60)),
}


@pytest.mark.ray
@pytest.mark.parametrize("case", list(TRANSPORT_CASES))
def test_sync_is_bit_identical(actors, case):
    import ray

    learner, gen = actors["learner"], actors["gen"]
    ptrs = ray.get(gen.pointers.remote())
    with TRANSPORT_CASES[case]() as t:
        t.setup(learner, [gen])
        stats = t.sync(learner, [gen], version=1, checksum=True)
        ray.get(learner.step.remote())  # mutate after the sync: the receiver must keep version 1
        expected = ray.get(learner.weights_checksum.remote())
        stats2 = t.sync(learner, [gen], version=2, checksum=True)
    assert stats2.checksums == [expected] != stats.checksums
    got = ray.get(gen.state.remote())
    want = ray.get(learner.export_weights.remote())
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert stats2.bytes == sum(v.numel() * v.element_size() for v in want.values())
    assert (stats2.transport, stats2.backend) == {"rdt-gloo": ("rdt", "gloo"), "object_store-channel": (
        "object_store", "channel")}.get(case, ("object_store", None))
    assert ray.get(gen.pointers.remote()) == ptrs  # loaded in place: every tensor kept its storage


class MasterLearner(Learner):
    """An fp32 learner whose generator holds bf16 weights (an HF policy under train.dtype bfloat16)."""

    weight_sync_dtype = torch.bfloat16

    def state(self):
        return self.model.state_dict()


class Bf16Gen(Generator):
    def __init__(self):
        super().__init__()
        self.model = TiedNet(22).to(torch.bfloat16)  # the int64 buffer stays int64


@pytest.mark.ray
@pytest.mark.parametrize("case", list(TRANSPORT_CASES))
def test_fp32_learner_syncs_into_a_bf16_generator(actors, case):
    """Every transport: the generator gets the fp32 learner's weights rounded to bf16, in place, and
    the bytes that cross are bf16 (the sender casts: packed and shared-memory payloads carry raw bytes)."""
    import ray

    learner, gen = (ray_actor_class(c, "rdt").options(num_cpus=0).remote() for c in (MasterLearner, Bf16Gen))
    try:
        ptrs = ray.get(gen.pointers.remote())
        with TRANSPORT_CASES[case]() as t:
            t.setup(learner, [gen])
            stats = t.sync(learner, [gen], version=1)
        got, want = ray.get(gen.state.remote()), ray.get(learner.state.remote())
        assert got.keys() == want.keys() and want["mid.weight"].dtype == torch.float32
        assert all(torch.equal(got[k], want[k].to(got[k].dtype)) for k in want)
        assert got["mid.weight"].dtype == torch.bfloat16 and got["steps"].dtype == torch.int64
        flat = {k: v for k, v in got.items() if k != "out.weight"}  # tied to emb.weight: sent once
        assert stats.bytes == sum(v.numel() * v.element_size() for v in flat.values())
        assert ray.get(gen.pointers.remote()) == ptrs
    finally:
        for h in (learner, gen):
            ray.kill(h)


@pytest.mark.ray
def test_object_store_payload_is_read_from_shared_memory_without_a_copy(actors):
    """The default object-store payload reaches the receiver as read-only views into Ray's shared
    memory (pickle5 out-of-band buffers), not as deserialised copies."""
    import ray

    # 1 MB: above Ray's 100 KB limit for objects inlined into the task reply, so in shared memory
    learner, gen = (ray_actor_class(c, "object_store").options(num_cpus=0).remote() for c in (BigLearner, BigGen))
    t = make_transport(WeightSyncConfig(transport="object_store", channel=False, timeout_s=60))
    t.setup(learner, [gen])
    stats = t.sync(learner, [gen], version=5, checksum=True)
    assert stats.checksums == [ray.get(learner.weights_checksum.remote())] and stats.bytes > 10**6
    kind, writeable = ray.get(gen.last_payload.remote())
    assert kind == "ShmPayload" and writeable == [False, False]  # weight and bias: views, never copies
    for a in (learner, gen):
        ray.kill(a)


@pytest.mark.ray
def test_rdt_pack_is_not_reused_while_a_ref_is_alive(actors):
    import ray

    learner, gen = actors["learner"], actors["gen"]
    with make_transport(WeightSyncConfig(transport="rdt", backend="gloo", timeout_s=60)) as t:
        t.setup(learner, [gen])
        t.sync(learner, [gen], version=1)  # leaves a released pack behind for reuse
        before = ray.get(learner.weights_checksum.remote())
        ref1 = learner.export_weights.options(tensor_transport="GLOO").remote("cpu", True)
        ray.get(learner.step.remote())
        # ref1 is still alive: this export must not refill the buffer ref1 points to
        ref2 = learner.export_weights.options(tensor_transport="GLOO").remote("cpu", True)
        after = ray.get(learner.weights_checksum.remote())
        ack1 = ray.get(gen.load_weights.remote(ref1, 2, True), timeout=60)
        ack2 = ray.get(gen.load_weights.remote(ref2, 3, True), timeout=60)
    assert before != after
    assert (ack1.checksum, ack2.checksum) == (before, after)


@pytest.mark.ray
def test_timeout_raises_naming_the_transport(actors):
    t = make_transport(WeightSyncConfig(transport="object_store", channel=False, timeout_s=2))
    t.setup(actors["learner"], [actors["stuck"]])
    with pytest.raises(WeightSyncTimeout, match=r"weight sync object_store .*timeout_s=2"):
        t.sync(actors["learner"], [actors["stuck"]], version=1)
    import ray

    ray.kill(actors["stuck"])  # it would sleep on; free its worker (killing twice is harmless)


@pytest.mark.ray
def test_channel_reuses_one_buffer_and_times_out_naming_the_transport(actors):
    """The channel's receiver reads read-only views of one shared buffer, the same one every sync
    (no fresh object per sync); a receiver that never finishes loading fails the sync within
    timeout_s, and teardown still returns."""
    import ray

    learner, gen = (ray_actor_class(c, "object_store").options(num_cpus=0).remote() for c in (BigLearner, BigGen))
    with make_transport(WeightSyncConfig(transport="object_store", channel=True, timeout_s=60)) as t:
        t.setup(learner, [gen])
        addresses = []
        for version in (1, 2):
            stats = t.sync(learner, [gen], version=version, checksum=True)
            assert stats.checksums == [ray.get(learner.weights_checksum.remote())] and stats.label == \
                "object_store/channel"
            kind, writeable = ray.get(gen.last_payload.remote())
            assert kind == "ShmPayload" and writeable == [False, False]  # views into the channel
            addresses.append(ray.get(gen.last_addresses.remote()))
            ray.get(learner.step.remote())
        assert addresses[0] == addresses[1]  # the same shared buffer both times
        with pytest.raises(WeightSyncError, match="other actors than setup"):
            t.sync(learner, [actors["gen"]], version=3)
    stuck = ray_actor_class(Stuck, "object_store").options(num_cpus=0).remote()
    ray.get(stuck.weight_sync_probe.remote(), timeout=60)  # started: setup's own 2 s probe must not race it
    t = make_transport(WeightSyncConfig(transport="object_store", channel=True, timeout_s=2))
    t.setup(learner, [stuck])
    with pytest.raises(WeightSyncTimeout, match=r"weight sync object_store/channel .*timeout_s=2"):
        t.sync(learner, [stuck], version=1)
    t.teardown()  # must not hang on the stuck reader
    for a in (learner, gen, stuck):
        ray.kill(a)


class AsyncGen(Generator):
    async def ping(self):  # one async method makes Ray run the whole actor on an event loop
        return True


@pytest.mark.ray
def test_channel_refuses_async_and_repeated_receivers_before_opening(actors):
    import ray

    agen = ray_actor_class(AsyncGen, "object_store").options(num_cpus=0).remote()
    t = make_transport(WeightSyncConfig(transport="object_store", timeout_s=60))
    with pytest.raises(BackendUnavailableError, match=r"object_store/channel does not support async actors"):
        t.setup(actors["learner"], [agen])
    with pytest.raises(WeightSyncError, match="must be distinct actors"):
        t.setup(actors["learner"], [actors["gen"], actors["gen"]])
    assert t._sender is None  # nothing was opened, so there is nothing to close
    ray.kill(agen)


@pytest.mark.ray
def test_channel_serves_several_receivers(actors):
    """One channel, two readers: each sync reaches both, bit for bit, and the next write waits for
    both (two syncs in a row would otherwise overwrite a value one reader has not copied)."""
    import ray

    learner, gen = actors["learner"], actors["gen"]
    second = ray_actor_class(Generator, "object_store").options(num_cpus=0).remote()
    with make_transport(WeightSyncConfig(transport="object_store", timeout_s=60)) as t:
        t.setup(learner, [gen, second])
        for version in (1, 2, 3):
            ray.get(learner.step.remote())
            stats = t.sync(learner, [gen, second], version=version, checksum=True)
            assert stats.checksums == [ray.get(learner.weights_checksum.remote())] * 2
            assert stats.num_receivers == 2
    ray.kill(second)


@pytest.mark.ray
@pytest.mark.parametrize("backend", ["nccl", "cuda_ipc"])
def test_gpu_backends_fail_at_setup_on_cpu(actors, backend):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: this checks the CPU-only failure")
    # skip the driver-side preflight (test_preflight_on_this_host) to reach the actors' probes
    t = make_transport(WeightSyncConfig(transport="rdt", backend=backend, timeout_s=30), preflight_check=False)
    with pytest.raises(BackendUnavailableError, match="use rdt/gloo or object_store"):
        t.setup(actors["learner"], [actors["gen"]])  # the actors' own probes


@pytest.mark.ray
def test_rdt_refuses_a_receiver_without_tensor_transport(actors):
    import ray

    # the pitfall: ActorClass.options() silently drops enable_tensor_transport (Ray 2.60)
    plain = ray.remote(Generator).options(num_cpus=0, **actor_options("rdt")).remote()
    t = make_transport(WeightSyncConfig(transport="rdt", backend="gloo", timeout_s=30))
    with pytest.raises(BackendUnavailableError, match="enable_tensor_transport=True"):
        t.setup(actors["learner"], [plain])
    ray.kill(plain)


class Silent(WeightReceiver):
    """A receiver that never answers a load: it sleeps for an hour (killed by the test)."""

    def __init__(self):
        self.model = TiedNet(44)

    def load_weights(self, state, version, checksum=False):
        time.sleep(3600)

    def read_weight_channel(self, key, version, checksum=False, timeout_s=None):
        time.sleep(3600)


@pytest.mark.ray
@pytest.mark.parametrize("case", ["object_store", "object_store/channel", "rdt/gloo"])
def test_a_sync_whose_receiver_never_answers_fails_within_its_timeout(actors, case):
    """No sync can hang: with a receiver that never answers, ``sync`` raises ``WeightSyncTimeout``
    naming ``train.weight_sync.timeout_s`` within that timeout (plus Ray's own latency), and the
    transport's teardown returns."""
    import ray

    transport, _, variant = case.partition("/")
    cfg = WeightSyncConfig(transport=transport, channel=variant == "channel", timeout_s=2)
    if transport == "rdt":
        cfg = WeightSyncConfig(transport="rdt", backend="gloo", timeout_s=2)
    silent = ray_actor_class(Silent, transport).options(num_cpus=0).remote()
    learner = ray_actor_class(Learner, transport).options(num_cpus=0).remote()
    ray.get([silent.weight_sync_probe.remote(), learner.weight_sync_probe.remote()], timeout=60)  # started
    t = make_transport(cfg)
    t.setup(learner, [silent])
    t0 = time.monotonic()
    with pytest.raises(WeightSyncTimeout, match=r"within train\.weight_sync\.timeout_s=2 s"):
        t.sync(learner, [silent], version=1)
    assert time.monotonic() - t0 < 2 + 10  # the bound, not a speed: a hang would run for an hour
    t.teardown()
    for a in (silent, learner):
        ray.kill(a)


@pytest.mark.ray
def test_weight_sync_bench_rows_carry_both_fractions(ray_session):
    """``rlpipe bench weight-sync``'s per-payload rows at its smallest settings: each run has its
    GB/s over the payload-sized memcpy (shape) and over the device's large copy (device), the
    in-process ``local`` sync included, every run bit-identical; the headline carries both."""
    import argparse

    from rlpipe.bench import weight_sync as bench

    args = argparse.Namespace(actor_threads=1, timeout_s=60.0, gap_s=0.0, repeats=1)
    runs = [("local", "cpu"), ("object_store", "cpu")]
    body = bench.bench_payload({"kind": "synthetic", "mb": 0.05}, runs, args, gpus=0.0)
    assert set(body["transports"]) == {"local@cpu", "object_store@cpu"}
    device = body["device_memcpy_cpu"]
    assert device["gbps"] > 0 and device["bytes"] == 1 << 28 and device["threads"] == 1
    for r in body["transports"].values():
        assert r["bit_identical"] and r["gbps"] == pytest.approx(r["bytes"] / r["median_s"] / 1e9)
        assert r["fraction_of_memcpy"] == pytest.approx(r["gbps"] / body["memcpy_cpu"]["gbps"])
        assert r["fraction_of_device_memcpy"] == pytest.approx(r["gbps"] / device["gbps"], rel=1e-3)
    h = bench.headline({"synthetic_0.05MB": body})
    fastest = max(body["transports"], key=lambda k: body["transports"][k]["gbps"])
    assert h["headline"] == f"{fastest}, payload synthetic_0.05MB"
    assert h["fraction_of_device_peak"] == body["transports"][fastest]["fraction_of_device_memcpy"]
    assert h["fraction_of_shape_peak"] == pytest.approx(body["transports"][fastest]["fraction_of_memcpy"], rel=1e-3)
