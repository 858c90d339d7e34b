"""FLOP accounting (hand values, and against torch's own FLOP counter), the matmul peak and the
update bench (issue 13 item 2)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from rlpipe.bench.flops import decode_flops, forward_flops, matmul_params, matmul_peak, train_flops
from rlpipe.lm import attention
from rlpipe.lm.model import ModelConfig, TransformerLM

TINY = ModelConfig(vocab_size=10, context_length=16, num_layers=1, d_model=4, num_heads=2, d_ff=8)


def test_hand_counted_values():
    # N_mm = L (4 D^2 + 3 D F) + D V = 64 + 96 + 40 = 200
    assert matmul_params(TINY) == 200
    # T = 3: 3 tokens x 2 N_mm + 4 L D x (1 + 2 + 3) attended positions = 1200 + 16 x 6
    assert forward_flops(TINY, [3]) == 1296
    assert forward_flops(TINY, [3, 3]) == 2 * 1296
    assert train_flops(TINY, [3]) == 3 * 1296


def test_kv_decoding_does_the_work_of_one_causal_forward():
    # prefill of P tokens + n single-token steps attend to 1..P+n positions: one forward over P+n
    assert decode_flops(TINY, 5, 7, 1) == forward_flops(TINY, [12])
    assert decode_flops(TINY, 5, 7, 3) == 3 * forward_flops(TINY, [12])


def test_matmul_count_equals_torch_flop_counter():
    """Naive (torch's FlopCounterMode over a real forward, attention through the math SDPA kernel,
    i.e. plain batched matmuls over the full T x T scores) vs ours."""
    cfg = ModelConfig(vocab_size=64, context_length=32, num_layers=2, d_model=16, num_heads=2, d_ff=48)
    model = TransformerLM(cfg)
    B, T = 3, 10
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(torch.randint(0, 64, (B, T)))  # (B, T) -> (B, T, V)
    counts = counter.get_flop_counts()["Global"]
    weights = sum(v for op, v in counts.items() if str(op).startswith("aten.mm"))
    scores = sum(v for op, v in counts.items() if str(op).startswith("aten.bmm"))
    assert weights == B * T * 2 * matmul_params(cfg)
    assert scores == cfg.num_layers * 4 * B * T * T * cfg.d_model  # QK^T and AV, full T x T
    # ours counts the causal lower triangle, T (T + 1) / 2 of the T x T scores
    ours_attn = forward_flops(cfg, [T] * B) - weights
    assert ours_attn == pytest.approx(scores * (T + 1) / (2 * T))


def test_grouped_query_attention_count_equals_torch_flop_counter():
    """An HF Qwen2 config (grouped-query attention: K and V of 2 heads' width, biases on Q, K, V),
    as qwen_step counts it: the weight products torch counts (``mm`` and the biased ``addmm``) are
    ``2 N_mm`` per token, the scores ``4 L D`` per attended position (full T x T in the math kernel)."""
    from rlpipe.bench import qwen_step

    cfg = qwen_step.qwen_config(vocab_size=64, hidden_size=16, intermediate_size=48, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    model = qwen_step.build_policy(cfg, "cpu", torch.float32)
    B, T = 3, 10
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(torch.randint(0, 64, (B, T)))  # (B, T) -> (B, T, V)
    counts = counter.get_flop_counts()["Global"]
    weights = sum(v for op, v in counts.items() if str(op).startswith(("aten.mm", "aten.addmm")))
    scores = sum(v for op, v in counts.items() if str(op).startswith("aten.bmm"))
    assert matmul_params(cfg) == 2 * (2 * 16 * 16 + 2 * 16 * 8 + 3 * 16 * 48) + 16 * 64  # D_kv = 16 x 2 / 4
    assert weights == B * T * 2 * matmul_params(cfg)
    assert scores == 2 * 4 * B * T * T * 16
    assert forward_flops(cfg, [T] * B) - weights == pytest.approx(scores * (T + 1) / (2 * T))


def test_matmul_peak_is_measured_per_size():
    peak = matmul_peak(sizes=(64, 128), repeats=2)
    assert set(peak["by_size"]) == {64, 128} and peak["size"] in (64, 128)
    assert peak["flops_per_s"] == max(peak["by_size"].values()) > 0


def test_update_bench_times_the_learners_real_step(tmp_path, capsys):
    from rlpipe.bench import update

    out = tmp_path / "update.json"
    res = update.main(["--batch", "4", "--group-size", "2", "--prompt-tokens", "4", "--response-tokens", "4",
                       "--repeats", "2", "--out", str(out)])
    assert out.read_text().strip() == capsys.readouterr().out.strip().splitlines()[-1]
    assert res["update_s"] == pytest.approx(res["fwd_bwd_s"] + res["optimizer_s"] + res["kl_monitor_s"], rel=1e-3)
    assert res["fwd_bwd_share"] + res["optimizer_share"] + res["kl_monitor_share"] == pytest.approx(1.0, abs=1e-3)
    # the fractions are FLOPs / time / peak: recompute one from the parts
    cfg = ModelConfig.from_preset("cpu-tiny", vocab_size=update.bench_tokenizer(2048, str(tmp_path)).vocab_size)
    fb = train_flops(cfg, [8] * 4, 4 * 4) / res["fwd_bwd_s"] / (res["matmul_peak_gflops"] * 1e9)  # head: responses
    assert res["fwd_bwd_fraction_of_peak"] == pytest.approx(fb, rel=0.01)
    assert 0 < res["update_fraction_of_peak"]
    assert res["goals"]["met"] == (res["update_fraction_of_peak"] >= res["goals"]["update_fraction_of_peak"] == 0.5)
    assert res["peak_memory_ratio"] == pytest.approx(res["full_head_fwd_bwd_peak_mb"] / res["fwd_bwd_peak_mb"],
                                                     abs=0.01)
    # beside the shape peak, the device peak in the run's dtype: both fractions of the same FLOP/s
    _assert_both_fractions(res)
    assert res["fraction_of_shape_peak"] == pytest.approx(res["update_fraction_of_peak"], abs=1e-4)
    assert res["fraction_of_device_peak"] == res["update_fraction_of_device_peak"]
    assert (res["device"], res["dtype"], res["device_peak_dtype"], res["device_peak_matmul_size"]) == (
        "cpu", "float32", "float32", 2048)
    assert res["fwd_bwd_fraction_of_device_peak"] == pytest.approx(
        fb * res["matmul_peak_gflops"] * 1e9 / res["device_peak"]["flops_per_s"], rel=0.01)


def test_update_bench_reports_the_response_only_heads_lower_peak_memory(capsys):
    from rlpipe.bench import update

    res = update.main(["--batch", "4", "--group-size", "2", "--prompt-tokens", "60", "--response-tokens", "4",
                       "--repeats", "1"])
    # the full head builds (B, 63, V) logits, the response-only head (B * 4, V): mostly prompt here.
    # Measured ratio 1.72 natively and with ATEN_CPU_CAPABILITY=avx2 and =default (allocation sizes
    # do not depend on the kernels: no noise); the threshold leaves 0.22 of margin.
    assert res["full_head_fwd_bwd_peak_mb"] > 1.5 * res["fwd_bwd_peak_mb"] > 0


def test_allocation_peak_counts_what_is_live_at_once():
    from rlpipe.bench.update import allocation_peak_bytes

    def work():
        x = torch.ones(1000, 1000)  # 4 MB
        y = x @ x  # + 4 MB: the peak
        del x
        z = y + 1  # y's 4 MB and z's 4 MB: not above the peak
        return z

    assert 8_000_000 <= allocation_peak_bytes(work) < 8_001_000  # (+ a scalar's few bytes)


@pytest.mark.parametrize("args, message", [
    (["--batch", "6", "--group-size", "4"], "divisible"),
    (["--device", "cuda"], "--device cuda: CUDA is not available"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--checkpoint", "/no/such.pt"], "does not exist"),
])
def test_update_bench_rejects_bad_arguments(args, message, capsys, monkeypatch):
    from rlpipe.bench import update

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same refusal on a GPU machine

    with pytest.raises(SystemExit):
        update.main(args)
    assert message in capsys.readouterr().err


def test_head_flops_count_only_the_positions_asked_for():
    cfg = ModelConfig.from_preset("cpu-tiny", vocab_size=1000)
    head = 2 * cfg.d_model * cfg.vocab_size  # one token through the LM head
    assert forward_flops(cfg, [10, 6]) == forward_flops(cfg, [10, 6], head_tokens=16)
    assert forward_flops(cfg, [10, 6]) - forward_flops(cfg, [10, 6], head_tokens=5) == 11 * head
    assert train_flops(cfg, [10], 4) == 3 * forward_flops(cfg, [10], 4)


# --------------------------------------------------------------------------- the device peak


class _Clock:
    """A fake ``time.perf_counter``: every call advances ``step`` seconds, so a timed call of
    ``fn`` repeated ``inner`` times takes exactly ``step`` (one call before, one after)."""

    def __init__(self, step: float):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step / 2
        return self.t


@pytest.fixture
def fresh_peak_cache():
    from rlpipe.bench import flops

    flops._matmul_rate_cached.cache_clear()
    flops._copy_rate_cached.cache_clear()
    yield flops
    flops._matmul_rate_cached.cache_clear()
    flops._copy_rate_cached.cache_clear()


def test_device_peak_is_work_over_the_median_time(fresh_peak_cache, monkeypatch):
    """With every timing exactly 0.5 s, the peak is the matmul's 2 n^3 FLOPs / 0.5 s and the copy
    rate the bytes / 0.5 s (hand values, no real timing); the dict says what was measured."""
    flops = fresh_peak_cache
    monkeypatch.setattr(flops.time, "perf_counter", _Clock(1.0))  # two calls per timing: 0.5 s
    peak = flops.device_peak("cpu", torch.float32, size=64, memcpy_bytes=4000)
    assert peak["flops_per_s"] == 2 * 64 ** 3 / 0.5 and peak["tflops"] == round(2 * 64 ** 3 / 0.5 / 1e12, 6)
    assert peak["memcpy_gbps"] == round(4000 / 1e9 / 0.5, 3) and peak["memcpy_bytes"] == 4000
    assert (peak["device"], peak["dtype"], peak["matmul_size"], peak["tf32"]) == ("cpu", "float32", 64, False)
    assert peak["threads"] == torch.get_num_threads()
    assert flops.device_memcpy("cpu", 4000) == {"device": "cpu", "gbps": peak["memcpy_gbps"], "bytes": 4000,
                                                "threads": torch.get_num_threads()}


def test_device_peak_is_measured_once_per_device_dtype_and_threads(fresh_peak_cache, monkeypatch):
    flops = fresh_peak_cache
    calls = []
    monkeypatch.setattr(flops, "_large_matmul_rate", lambda dev, dt, n: calls.append((str(dev), dt, n)) or 1e9)
    monkeypatch.setattr(flops, "_large_copy_rate", lambda dev, n: calls.append(("copy", n)) or 2.0)
    for _ in range(3):
        flops.device_peak("cpu", torch.float32, memcpy_bytes=1000)
    assert calls == [("cpu", torch.float32, flops.DEVICE_PEAK_SIZE["cpu"]), ("copy", 1000)]
    peak = flops.device_peak("cpu", "bfloat16", memcpy_bytes=1000)  # another dtype: its own matmul, the same copy
    bf16_side = flops.peak_size("cpu", "bfloat16", attention.cpu_flags())  # this CPU's, by its features
    assert calls[2:] == [("cpu", torch.bfloat16, bf16_side)] and peak["dtype"] == "bfloat16"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)  # other threads, another CPU peak
        flops.device_peak("cpu", torch.float32, memcpy_bytes=1000)
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == 5


@pytest.mark.parametrize("device, dtype, flags, side", [
    ("cpu", "float32", set(), 2048),
    ("cpu", "bfloat16", {"avx2", "fma"}, 1024),                 # emulated: AVX2 only
    ("cpu", "bfloat16", {"avx512f", "avx512_bf16"}, 2048),
    ("cpu", "bfloat16", {"amx_tile", "amx_bf16"}, 2048),
    ("cpu", "float16", {"avx512f", "amx_bf16"}, 1024),          # bf16 units do not multiply fp16
    ("cpu", "float16", {"amx_fp16"}, 2048),
    ("cuda", "bfloat16", set(), 8192), ("cuda", "float32", set(), 8192),
])
def test_device_peak_side_follows_the_cpu_s_units(device, dtype, flags, side):
    """The whole decision table: a dtype the CPU has no units for is measured at the emulated side."""
    from rlpipe.bench.flops import peak_size

    assert peak_size(device, dtype, flags) == side


def test_device_peak_really_multiplies_large_matrices(fresh_peak_cache):
    """Structure of a real (small, so fast) measurement: positive rates, the sizes asked for."""
    peak = fresh_peak_cache.device_peak("cpu", torch.float32, size=128, memcpy_bytes=1 << 20)
    assert peak["flops_per_s"] > 0 and peak["memcpy_gbps"] > 0 and peak["matmul_size"] == 128
    assert peak["device_name"] == "cpu"


def test_peak_fields_divide_one_rate_by_both_peaks():
    from rlpipe.bench.flops import PEAK_NOTE, peak_fields

    chip = {"flops_per_s": 8e11, "tflops": 0.8, "dtype": "bfloat16", "matmul_size": 8192}
    out = peak_fields(2e9, 4e9, chip)
    assert out["fraction_of_shape_peak"] == 0.5 and out["fraction_of_device_peak"] == 0.0025
    assert (out["device_peak_tflops"], out["device_peak_dtype"], out["device_peak_matmul_size"]) == (0.8, "bfloat16",
                                                                                                      8192)
    assert out["shape_peak_gflops"] == 4.0 and out["device_peak"] is chip and out["peak_note"] == PEAK_NOTE
    assert "fraction_of_shape_peak" in PEAK_NOTE and "fraction_of_device_peak" in PEAK_NOTE


def _assert_both_fractions(res: dict) -> None:
    """A bench JSON's two fractions: present, positive, and the same FLOP/s over the two peaks."""
    assert res["fraction_of_shape_peak"] > 0 and res["fraction_of_device_peak"] > 0
    assert res["fraction_of_shape_peak"] / res["fraction_of_device_peak"] == pytest.approx(
        res["device_peak"]["flops_per_s"] / (res["shape_peak_gflops"] * 1e9), rel=2e-3)
    assert res["device_peak_dtype"] == res["device_peak"]["dtype"] and res["peak_note"]


def test_update_parts_on_a_gpu_wait_for_their_kernels(monkeypatch):
    """On CUDA the three parts' clocks stop after a device synchronize (kernels run asynchronously:
    without it a part's time would be its launches only). CPU-reachable: a stand-in learner on a
    'cuda' device and a recording synchronize."""
    from rlpipe.bench import update

    log = []

    class Tensors:
        def to(self, device):
            return self

    class FakeLearner:
        device, pad_id = torch.device("cuda"), 0

        def _accumulate_gradients(self, t, ref, step):
            log.append("fwd_bwd")
            return None, None

        def _optimizer_step(self, step, sums):
            log.append("optimizer")

        def _kl_metrics(self, t, pre_lp, ref):
            log.append("kl_monitor")
            return {}

    monkeypatch.setattr(update, "build_train_tensors", lambda batch, pad: Tensors())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    times = update._timed_step(FakeLearner(), None, 1)
    assert log == ["sync", "fwd_bwd", "sync", "optimizer", "sync", "kl_monitor", "sync"]
    assert set(times) == set(update.PARTS)
