"""Weight payloads without Ray: the object store's shared-memory payload (``ShmPayload``) against the
naive named-tensor payload, packing, in-place loads, layout checks; the bench's bookkeeping."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from rlpipe.bench import weight_sync as bench
from rlpipe.bench import weight_sync_peers as peers
from rlpipe.trainer.weight_sync import (
    ShmPayload,
    WeightReceiver,
    WeightSender,
    WeightSyncError,
    WeightSyncTimeout,
    copy_weights,
    flat_weights,
    shm_payload,
    weights_checksum,
)
from rlpipe.trainer.weight_sync import payload as payload_mod
from rlpipe.trainer.weight_sync.payload import SHM_CHUNK_BYTES


class MixedNet(nn.Module):
    """Every dtype family a model may hold: fp32 and bf16 parameters, an int64 and a bool buffer, a
    0-d tensor, an empty one, a tied matrix and a non-contiguous (transposed) parameter."""

    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(30, 8)
        self.head = nn.Linear(8, 30, bias=False)
        self.head.weight = self.emb.weight
        self.low = nn.Parameter(torch.randn(5, 3, generator=g).to(torch.bfloat16))
        self.t = nn.Parameter(torch.randn(4, 6, generator=g).t())  # (6, 4), not contiguous
        self.register_buffer("count", torch.tensor(seed, dtype=torch.int64))
        self.register_buffer("mask", torch.rand(7, generator=g) > 0.5)
        self.register_buffer("empty", torch.zeros(0, 3))
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(30, 8, generator=g))


class Peer(WeightSender, WeightReceiver):
    def __init__(self, model: nn.Module):
        self.model = model


def _equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("pack", [False, True], ids=["views", "packed"])
def test_shm_payload_equals_the_naive_per_tensor_path(pack):
    """naive (named torch tensors) vs optimised (ShmPayload): the receiver ends bit-identical."""
    src = MixedNet(1)
    naive, shm = Peer(MixedNet(2)), Peer(MixedNet(3))
    assert not _equal(src, naive.model)
    ptrs = {k: v.data_ptr() for k, v in shm.model.state_dict().items()}
    naive.load_weights(Peer(src).export_weights("cpu", False), version=1)
    payload = Peer(src).export_weights_shm(pack)
    assert isinstance(payload, ShmPayload) and payload.packed is pack
    assert all(c.dtype == np.uint8 and c.ndim == 1 and c.nbytes <= SHM_CHUNK_BYTES
               for chunks in payload.buffers.values() for c in chunks)
    ack = shm.load_weights(payload, version=1, checksum=True)
    assert _equal(src, naive.model) and _equal(src, shm.model)
    assert ack.checksum == weights_checksum(src) == weights_checksum(naive.model)
    assert ack.bytes == payload.nbytes == sum(t.numel() * t.element_size() for t in flat_weights(src).values())
    # in place: every tensor keeps its storage, the tie survives
    assert {k: v.data_ptr() for k, v in shm.model.state_dict().items()} == ptrs
    assert shm.model.head.weight.data_ptr() == shm.model.emb.weight.data_ptr()


@pytest.mark.parametrize("pack", [False, True], ids=["views", "packed"])
def test_chunked_payload_loads_across_chunk_and_tensor_boundaries(monkeypatch, pack):
    """Buffers are cut into chunks of SHM_CHUNK_BYTES (Ray copies each with a plain memcpy); with
    10-byte chunks every chunk boundary falls inside a tensor, and packed chunks span tensors."""
    monkeypatch.setattr(payload_mod, "SHM_CHUNK_BYTES", 10)
    src, dst = MixedNet(7), Peer(MixedNet(8))
    payload = Peer(src).export_weights_shm(pack)
    sizes = [c.nbytes for chunks in payload.buffers.values() for c in chunks]
    assert max(sizes) == 10 and len(sizes) > len(payload.buffers)  # really chunked
    assert payload.nbytes == sum(t.numel() * t.element_size() for t in flat_weights(src).values())
    dst.load_weights(payload, version=1)
    assert _equal(dst.model, src)
    assert not dst.model.t.is_contiguous()  # the transposed parameter was loaded through a temporary


@pytest.mark.parametrize("pack", [False, True], ids=["views", "packed"])
def test_one_element_tensor_with_an_odd_stride_round_trips(pack):
    """``x[0:1, 0]`` counts as contiguous but keeps stride 4, which a flat ``view`` refuses."""
    def net(base: torch.Tensor) -> nn.Module:
        m = nn.Module()
        m.register_buffer("one", base.view(3, 4)[0:1, 0])
        return m

    src, dst = net(torch.arange(12.0) + 5), net(torch.zeros(12))
    assert src.one.is_contiguous() and src.one.stride() == (4,)
    Peer(dst).load_weights(Peer(src).export_weights_shm(pack), version=1)
    assert torch.equal(dst.one, torch.tensor([5.0])) and weights_checksum(dst) == weights_checksum(src)


def test_shm_payload_with_missing_bytes_is_refused():
    payload = Peer(MixedNet(9)).export_weights_shm(False)
    short = {k: (b[0][:-1], *b[1:]) if k == "emb.weight" else b for k, b in payload.buffers.items()}
    with pytest.raises(WeightSyncError, match=r"'emb.weight': 959 bytes received, the model has 960"):
        Peer(MixedNet(10)).load_weights(ShmPayload(payload.layout, False, short), version=1)


def test_shm_views_share_the_senders_memory_and_packs_are_reused_copies():
    model = MixedNet(4)
    views, none = shm_payload(flat_weights(model), pack=None)  # CPU model: views, nothing to keep
    assert none is None and not views.packed
    assert np.shares_memory(views.buffers["emb.weight"][0], model.emb.weight.detach().numpy())
    first, kept = shm_payload(flat_weights(model), pack=True)
    addr = first.buffers["torch.float32"][0].ctypes.data
    assert not np.shares_memory(first.buffers["torch.float32"][0], model.emb.weight.detach().numpy())
    second, _ = shm_payload(flat_weights(model), pack=True, into=kept)
    assert second.buffers["torch.float32"][0].ctypes.data == addr  # refilled, not reallocated
    assert set(second.buffers) == {"torch.float32", "torch.bfloat16", "torch.int64", "torch.bool"}
    other, _ = shm_payload(flat_weights(nn.Linear(3, 3)), pack=True, into=kept)  # another layout: fresh
    assert other.buffers["torch.float32"][0].ctypes.data != addr


@pytest.mark.parametrize("pack", [False, True], ids=["views", "packed"])
def test_shm_payload_with_another_layout_is_refused(pack):
    # same byte count, other dtypes and shapes: without the layout check the bytes would be misread
    sender = nn.Module()
    sender.register_buffer("w", torch.ones(2, 4, dtype=torch.float16))
    receiver = nn.Module()
    receiver.register_buffer("w", torch.zeros(2, 2))
    payload = Peer(sender).export_weights_shm(pack)
    assert payload.nbytes == 16
    with pytest.raises(WeightSyncError, match="another layout"):
        Peer(receiver).load_weights(payload, version=1)
    assert torch.equal(receiver.w, torch.zeros(2, 2))  # nothing was written


def test_read_only_buffers_load_without_a_copy_or_warning():
    """Ray hands the receiver read-only views into shared memory: loading must accept them."""
    payload = Peer(MixedNet(5)).export_weights_shm(False)
    ro = {k: tuple(np.frombuffer(c.tobytes(), dtype=np.uint8) for c in b)  # read-only
          for k, b in payload.buffers.items()}
    assert not any(c.flags.writeable for b in ro.values() for c in b)
    dst = Peer(MixedNet(6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns about non-writable arrays unless we handle them
        dst.load_weights(ShmPayload(payload.layout, False, ro), version=2)
    assert _equal(dst.model, MixedNet(5))


# --------------------------------------------------------------------------- bench bookkeeping


def test_bench_synthetic_payload_sizes_and_repeats():
    for mb in (1, 4.2, 10):
        spec = {"kind": "synthetic", "mb": mb}
        model = peers.build_model(spec)
        shapes = [tuple(t.shape) for t in model.state_dict().values()]
        assert all(s[1] == 1024 and s[0] <= 1024 for s in shapes)
        assert peers.payload_bytes(spec) == sum(t.numel() * 4 for t in model.state_dict().values())
        assert abs(peers.payload_bytes(spec) - mb * 1e6) < 4096
    assert [bench.timed_repeats(n, 5) for n in (1e6, 1e8, 1e9, 1e10)] == [5, 5, 3, 3]
    assert bench.timed_repeats(1e9, 1) == 1
    assert bench.memcpy_repeats(1e6) == 200 and bench.memcpy_repeats(1e9) == 10
    assert bench._parse(["--sizes-mb", "1, 100"]).sizes_mb == [1.0, 100.0]
    assert bench._parse([]).sizes_mb == [1.0, 10.0, 100.0, 1000.0]
    with pytest.raises(SystemExit):
        bench._parse(["--sizes-mb", "0"])


def _run(s: float, memcpy_s: float) -> dict:
    return {"median_s": s, "gbps": 1.0 / s, "fraction_of_memcpy": memcpy_s / s}


def test_bench_best_and_cpu_verdict_by_hand():
    timed = {"object_store@cpu": _run(0.05, 0.015), "object_store/tensors@cpu": _run(0.4, 0.015),
             "rdt/gloo@cpu": _run(0.2, 0.015)}
    best = bench.best_of(timed, "cpu")
    assert best["object_store"] == "object_store" and best["rdt"] == "rdt/gloo" and best["winner"] == "object_store"
    assert best["rdt_over_object_store"] == pytest.approx(4.0)
    assert best["winner_fraction_of_memcpy"] == pytest.approx(0.3)
    payloads = {"synthetic_100MB": {"bytes": 10**8, "best": {"cpu": best}},
                "synthetic_1MB": {"bytes": 10**6, "best": {"cpu": dict(best, winner_fraction_of_memcpy=0.01)}}}
    v = bench.cpu_verdict(payloads)
    assert v["cpu_winner"] == {"synthetic_100MB": "object_store", "synthetic_1MB": "object_store"}
    assert v["goal"]["met"] is True and v["goal"]["fraction_of_memcpy"] == {"synthetic_100MB": pytest.approx(0.3)}
    payloads["synthetic_100MB"]["best"]["cpu"] = dict(best, winner_fraction_of_memcpy=0.29)
    assert bench.cpu_verdict(payloads)["goal"]["met"] is False
    assert bench.cpu_verdict({"synthetic_1MB": payloads["synthetic_1MB"]})["goal"]["met"] is None  # not measured


def _gpu_run(gbps: float, device_gbps: float) -> dict:
    return {"median_s": 1 / gbps, "gbps": gbps, "fraction_of_memcpy": gbps / 100.0,
            "fraction_of_device_memcpy": gbps / device_gbps}


def test_bench_gpu_goal_and_headline_by_hand():
    """Same-GPU syncs against the device memcpy (1000 GB/s here) at payloads >= 100 MB: met only
    when every one reaches 0.3; a failed sync misses it; the headline is the fastest run of the
    largest payload, with both of its fractions."""
    big = {"bytes": 10**9, "transports": {"local@gpu-shared": _gpu_run(400.0, 1000.0),
                                          "rdt/cuda_ipc@gpu-shared": _gpu_run(300.0, 1000.0),
                                          "object_store@gpu-shared": _gpu_run(5.0, 1000.0),
                                          "rdt/nccl@gpu": {"skipped": "needs 2 GPU(s), Ray sees 1"}}}
    small = {"bytes": 10**6, "transports": {"local@gpu-shared": _gpu_run(1.0, 1000.0)}}
    payloads = {"synthetic_1000MB": big, "synthetic_1MB": small}
    v = bench.gpu_verdict(payloads)
    assert v["met"] is True and v["fraction_of_device_memcpy"] == {
        "synthetic_1000MB local@gpu-shared": 0.4, "synthetic_1000MB rdt/cuda_ipc@gpu-shared": 0.3}
    big["transports"]["rdt/cuda_ipc@gpu-shared"] = _gpu_run(299.0, 1000.0)
    assert bench.gpu_verdict(payloads)["met"] is False
    big["transports"]["rdt/cuda_ipc@gpu-shared"] = {"failed": "weight sync rdt/cuda_ipc (version 1) did not "
                                                              "finish within train.weight_sync.timeout_s=30 s"}
    assert bench.gpu_verdict(payloads)["met"] is False
    assert bench.gpu_verdict({"synthetic_1MB": small})["met"] is None  # no payload of 100 MB or more
    h = bench.headline(payloads)
    assert h["headline"] == "local@gpu-shared, payload synthetic_1000MB"
    assert (h["fraction_of_shape_peak"], h["fraction_of_device_peak"]) == (4.0, 0.4)
    assert "fraction_of_device_memcpy" in h["peak_note"] and "fraction_of_memcpy" in h["peak_note"]
    assert bench.headline({})["fraction_of_device_peak"] is None


class _FailingTransport:
    label = "rdt/cuda_ipc"

    def sync(self, sender, receivers, version, checksum=False):
        raise WeightSyncTimeout("weight sync rdt/cuda_ipc (version 0) did not finish within "
                                      "train.weight_sync.timeout_s=1 s")


def test_bench_records_a_failed_sync_and_goes_on(monkeypatch):
    """A run whose sync fails (here: times out) is reported with its message, and is not tried
    again; the bench does not stop (the other runs here: none, so no Ray is needed)."""
    out = bench._time_runs({"rdt/cuda_ipc@gpu-shared": (_FailingTransport(), None, None)}, repeats=2, gap_s=0)
    assert out == {"rdt/cuda_ipc@gpu-shared": {"failed": "weight sync rdt/cuda_ipc (version 0) did not finish "
                                                         "within train.weight_sync.timeout_s=1 s"}}
    assert bench.best_of(out, "gpu-shared")["winner"] is None


def test_bench_placements_are_checked():
    assert bench._parse(["--placements", "gpu-shared, gpu"]).placements == ["gpu-shared", "gpu"]
    assert bench._parse([]).placements is None
    for bad in ("gpu2", ","):
        with pytest.raises(SystemExit):
            bench._parse(["--placements", bad])
    with pytest.raises(SystemExit):
        bench._parse(["--timeout-s", "0"])


def test_same_device_sync_is_one_fused_copy(monkeypatch):
    """``copy_weights`` (the colocated worker's sync) and ``pack_weights`` move every tensor in one
    ``torch._foreach_copy_`` call (on a GPU: a few multi-tensor kernels, no per-tensor launch or
    host round trip), and the result is bit-identical."""
    calls = []
    real = torch._foreach_copy_

    def spy(dst, src, *a, **k):
        calls.append(len(dst))
        return real(dst, src, *a, **k)

    monkeypatch.setattr(torch, "_foreach_copy_", spy)
    src, dst = MixedNet(1), MixedNet(2)
    n = len(flat_weights(src))
    stats = payload_mod.copy_weights(src, dst)
    assert calls == [n] and _equal(src, dst) and stats.bytes == payload_mod.state_bytes(flat_weights(src))
    packed = payload_mod.pack_weights(flat_weights(src), "cpu")
    assert calls == [n, n] and set(packed) == {"torch.float32", "torch.bfloat16", "torch.int64", "torch.bool",
                                               payload_mod.LAYOUT_KEY}
    receiver = Peer(MixedNet(3))
    receiver.load_weights(packed, 1)
    assert calls == [n, n, n] and _equal(src, receiver.model)


class _Extra(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def get_extra_state(self):
        return {"note": 1}

    def set_extra_state(self, state):
        pass


PRE_HOOK_CALLS: list[str] = []


def _models() -> dict[str, nn.Module]:
    from rlpipe.lm.model import ModelConfig, TransformerLM

    shared = nn.Linear(3, 3)
    hooked = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    hooked[1]._register_state_dict_hook(lambda m, sd, prefix, meta: sd.pop(prefix + "bias"))  # drops an entry
    pre_hooked = nn.Sequential(nn.Linear(2, 2))
    pre_hooked[0].register_state_dict_pre_hook(lambda m, prefix, keep_vars: PRE_HOOK_CALLS.append(prefix))
    holes = nn.Sequential(nn.Linear(2, 2, bias=False), nn.ReLU())
    holes.register_buffer("gone", None)
    holes.register_parameter("nothing", None)
    holes.register_buffer("scratch", torch.zeros(3), persistent=False)  # not in the state dict
    return {"mixed": MixedNet(0), "pre_hooked": pre_hooked,
            "transformer": TransformerLM(ModelConfig.from_preset("cpu-tiny", vocab_size=64)),
            "shared_submodule": nn.Sequential(shared, nn.Tanh(), shared), "hooked": hooked,
            "extra_state": nn.Sequential(nn.Linear(2, 2), _Extra()), "none_entries": holes}


@pytest.mark.parametrize("name", list(_models()))
def test_state_tensors_equal_the_state_dict(name):
    """The fast state-dict read (naive: ``state_dict()``) gives the same names in the same order and
    the same storage, detached; a module that customises its state dict falls back to it."""
    model = _models()[name]
    want, got = model.state_dict(), payload_mod._state_tensors(model)
    assert list(got) == list(want)
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert got[k].data_ptr() == v.data_ptr() and got[k].shape == v.shape and not got[k].requires_grad
        else:  # an extra state: only the real state_dict() has it
            assert got[k] == v
    if name == "pre_hooked":  # a pre-hook runs, so the real state_dict() was taken
        n = len(PRE_HOOK_CALLS)
        payload_mod._state_tensors(model)
        assert len(PRE_HOOK_CALLS) == n + 1
    if name == "shared_submodule":  # the second name of a shared tensor is dropped, as before
        assert list(flat_weights(model)) == ["0.weight", "0.bias"]


def test_state_tensors_read_each_submodule_once_without_state_dict(monkeypatch):
    model = _models()["transformer"]
    monkeypatch.setattr(nn.Module, "state_dict", lambda self, *a, **k: pytest.fail("state_dict() was called"))
    assert payload_mod._state_tensors(model)  # the plain path: no state_dict() at any level


# --------------------------------------------------------------------------- fp32 sender, bf16 receiver


def _bf16_twin(seed: int) -> nn.Module:
    return MixedNet(seed).to(torch.bfloat16)  # floating tensors bf16; the int64 and bool buffers kept


def _cast_equal(received: nn.Module, sent: nn.Module) -> bool:
    """``received`` holds ``sent``'s values rounded to its dtypes (the ints and bools unchanged)."""
    r, s = flat_weights(received), flat_weights(sent)
    return r.keys() == s.keys() and all(torch.equal(r[k], s[k].to(r[k].dtype)) for k in r)


SENDS = {  # the export every transport uses: rdt (packed), object_store (views / packed, and naive tensors)
    "tensors": lambda p: p.export_weights("cpu", False),
    "packed": lambda p: p.export_weights("cpu", True),
    "shm_views": lambda p: p.export_weights_shm(False),
    "shm_packed": lambda p: p.export_weights_shm(True),
}


@pytest.mark.parametrize("path", list(SENDS))
def test_fp32_sender_syncs_into_a_bf16_receiver_rounded(path):
    """An fp32 learner (master weights) into a bf16 generator: with ``weight_sync_dtype`` the sender
    exports floating weights in bf16 (half the bytes) and the receiver gets them rounded to nearest."""
    src, dst = MixedNet(1), Peer(_bf16_twin(2))
    assert not _cast_equal(dst.model, src)
    sender = Peer(src)
    sender.weight_sync_dtype = torch.bfloat16
    ptrs = {k: v.data_ptr() for k, v in dst.model.state_dict().items()}
    ack = dst.load_weights(SENDS[path](sender), version=1)
    assert _cast_equal(dst.model, src)
    assert ack.bytes == sum(t.numel() * t.element_size() for t in flat_weights(dst.model).values())
    assert {k: v.data_ptr() for k, v in dst.model.state_dict().items()} == ptrs  # in place
    assert src.emb.weight.dtype == torch.float32  # the sender's own weights untouched


def test_a_named_fp32_payload_is_cast_by_the_receiver_but_raw_bytes_need_the_senders_cast():
    """The in-process sync (``copy_weights``, colocated) and named tensors cast on the receiver's copy;
    packed and shared-memory payloads carry raw bytes, so without the sender's cast the layout check
    refuses them before anything is written."""
    src = MixedNet(3)
    local = _bf16_twin(4)
    copy_weights(src, local)
    assert _cast_equal(local, src)
    named = Peer(_bf16_twin(4))
    named.load_weights(Peer(src).export_weights("cpu", False), version=1)
    assert _cast_equal(named.model, src)
    for send in ("packed", "shm_views", "shm_packed"):
        dst = Peer(_bf16_twin(5))
        before = weights_checksum(dst.model)
        with pytest.raises(WeightSyncError, match="another layout"):
            dst.load_weights(SENDS[send](Peer(src)), version=1)
        assert weights_checksum(dst.model) == before, send
    with pytest.raises(WeightSyncError, match="'count'"):  # a non-floating dtype is never cast
        Peer(_bf16_twin(6)).load_weights({**Peer(src).export_weights("cpu", False),
                                          "count": torch.tensor(1.0)}, version=1)
