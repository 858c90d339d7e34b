"""CPU attention routing (``rlpipe.lm.attention``): torch's CPU flash kernel raises for bf16 on a CPU
with AMX once ``ATEN_CPU_CAPABILITY`` lowers the level below AVX512, so such calls take the math
backend.

- The decision table, by its inputs (flags, level), on every machine.
- Each call site follows the decision: ``sdpa`` itself, ``TransformerLM`` (pretraining, learner,
  sampler), the static decode step, ``torch.compile`` (its graph has no flash op when routed) and an
  HF model through transformers' ``sdpa`` attention. The decision is forced here, so a machine
  without AMX checks the routed path too.
- The real thing, in subprocesses at each kernel level this machine allows (``tests/attention_probe.py``):
  bf16 forward and backward against fp32 within a measured tolerance, and the pretraining loss. On a
  machine with AMX this is the failing case itself; the probe says which levels routed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from rlpipe.lm import attention
from rlpipe.lm.model import ModelConfig, TransformerLM

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
PROBE = Path(__file__).with_name("attention_probe.py")
LEVELS = ("DEFAULT", "AVX2", "AVX512")  # torch's x86 kernel levels, lowest first
#: Largest |bf16 - fp32| of attention's output and input gradients, relative to the fp32 maximum,
#: and of the pretraining loss (tests/attention_probe.py). Measured on AMD EPYC (AVX2), 20 seeds x
#: T in (8, 64, 128), native and math backends, levels AVX2 and DEFAULT: at most 0.0112 and 0.00086.
ATTENTION_TOLERANCE = 0.04
LOSS_TOLERANCE = 0.005

AMX_SPR = {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}  # a Sapphire Rapids Xeon


@pytest.mark.parametrize(("flags", "level", "expected"), [
    (set(), "AVX2", set()),  # an AMD EPYC without AVX-512
    ({"avx512f", "avx512_bf16"}, "DEFAULT", set()),  # AVX-512 BF16 without AMX: no packing
    (AMX_SPR, "AVX512", set()),  # AMX at the native level: the kernel's packing exists
    (AMX_SPR, "AVX2", {BF16}),  # the failing case
    (AMX_SPR, "DEFAULT", {BF16}),
    (AMX_SPR, "avx2", {BF16}),  # the level as the environment variable spells it
    (AMX_SPR | {"amx_fp16"}, "AVX2", {BF16, FP16}),  # Granite Rapids: fp16 packs too
    ({"amx_tile", "amx_fp16"}, "DEFAULT", {FP16}),
    ({"amx_bf16"}, "AVX2", set()),  # no tiles, no packing
])
def test_decision_table(flags, level, expected):
    assert attention.decide(flags, level) == expected


def test_cpu_flags_reads_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Xeon\nflags\t\t: fpu avx2 amx_bf16 amx_tile avx512_bf16\n"
                       "processor\t: 1\nflags\t\t: fpu\n")
    assert {"fpu", "avx2", "amx_bf16", "amx_tile", "avx512_bf16"} <= attention.cpu_flags(cpuinfo)
    assert attention.cpu_flags(tmp_path / "absent") >= set()  # unreadable: torch's own checks only


def test_this_process_decided_from_this_cpu():
    assert attention.math_dtypes() == attention.decide(attention.cpu_flags(),
                                                       torch.backends.cpu.get_cpu_capability())
    assert "torch kernel level" in attention.describe()


@pytest.fixture
def flash_seen(monkeypatch):
    """Records, for each SDPA call, whether torch may pick its flash kernel (False inside the math
    backend's context); the calls themselves run unchanged."""
    seen: list[tuple[torch.dtype, bool]] = []
    real = F.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        autocast = q.dtype == FP32 and torch.is_autocast_enabled("cpu")  # SDPA runs in autocast's dtype
        seen.append((torch.get_autocast_dtype("cpu") if autocast else q.dtype,
                     torch.backends.cuda.flash_sdp_enabled()))
        return real(q, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return seen


def _route(monkeypatch, dtypes):
    monkeypatch.setattr(attention, "MATH_DTYPES", frozenset(dtypes))


def test_sdpa_takes_the_math_backend_only_where_decided(monkeypatch, flash_seen):
    q = torch.randn(2, 4, 64, 16)  # (B, H, T, Dh)
    _route(monkeypatch, {BF16})
    for dtype in (BF16, FP32):
        x = q.to(dtype)
        attention.sdpa(x, x, x, is_causal=True)
    _route(monkeypatch, set())
    attention.sdpa(q.to(BF16), q.to(BF16), q.to(BF16), is_causal=True)
    assert flash_seen == [(BF16, False), (FP32, True), (BF16, True)]
    assert torch.backends.cuda.flash_sdp_enabled()  # the context restored torch's setting


def _tiny_model() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(ModelConfig.from_preset("cpu-tiny", vocab_size=64, num_layers=2, d_model=32,
                                                 num_heads=2, d_ff=64, context_length=64))


def test_transformer_lm_and_static_decode_follow_the_decision(monkeypatch, flash_seen):
    from rlpipe.lm.static_decode import decode_step, rope_cos_sin

    _route(monkeypatch, {BF16})
    model = _tiny_model()
    x = torch.randint(0, 64, (2, 40))  # (B, T)
    with torch.autocast("cpu", dtype=BF16):
        model(x).float().sum().backward()
        N, S, H, Dh = 2, 8, model.config.num_heads, model.config.head_dim
        ks = [torch.zeros(N, H, S, Dh) for _ in model.layers]
        vs = [torch.zeros(N, H, S, Dh) for _ in model.layers]
        cos, sin = rope_cos_sin(model, torch.device("cpu"))
        keys = torch.ones(N, S, dtype=torch.bool)  # (N, S)
        with torch.no_grad():
            decode_step(model, cos, sin, x[:, 0], torch.zeros(N, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                        keys, ks, vs)
    assert len(flash_seen) == 2 * len(model.layers)
    assert flash_seen == [(BF16, False)] * len(flash_seen)


class _GraphSeen(Exception):
    """Raised by the capture pass: the graph inductor would lower is read, no kernel is built."""


def test_compiled_decode_step_has_no_flash_call_when_routed(monkeypatch):
    """The compiled decode (inductor, bf16 autocast): routed, the graph inductor lowers to code holds no
    flash kernel, so neither the trace nor inductor's attention pattern matcher (its joint-graph passes)
    brings it back. The graph is read in inductor's last custom post-grad pass, after every pattern
    pass; the pass then stops the compile, so no C++ kernel is built for a check of the graph."""
    import torch._inductor.config as inductor_config

    from rlpipe.lm.static_decode import decode_step, inductor_vectorizes_cpu, rope_cos_sin

    if not inductor_vectorizes_cpu():
        pytest.skip("torch inductor builds no CPU bf16 kernel at this level (no vector ISA); rlpipe's compiled "
                    "decode runs eagerly there (test_static_decode)")

    model = _tiny_model()
    N, S, H, Dh = 2, 8, model.config.num_heads, model.config.head_dim
    cos, sin = rope_cos_sin(model, torch.device("cpu"))
    keys = torch.ones(N, S, dtype=torch.bool)  # (N, S)
    zero = torch.zeros(N, dtype=torch.long)

    def step(tok):
        ks = [torch.zeros(N, H, S, Dh) for _ in model.layers]
        vs = [torch.zeros(N, H, S, Dh) for _ in model.layers]
        with torch.autocast("cpu", dtype=BF16):
            return decode_step(model, cos, sin, tok, zero, zero[:1], keys, ks, vs)  # (N, V)

    def lowered_graph(dtypes) -> str:
        _route(monkeypatch, dtypes)
        graphs = []

        def capture(graph):
            graphs.append(str(graph))
            raise _GraphSeen

        torch._dynamo.reset()
        with inductor_config.patch(post_grad_custom_post_pass=capture), torch.no_grad():
            with pytest.raises(Exception) as stopped:
                torch.compile(step, fullgraph=True)(zero)
        torch._dynamo.reset()
        assert len(graphs) == 1 and "_GraphSeen" in repr(stopped.value), stopped.value  # stopped by the capture
        return graphs[0]

    assert "flash_attention" in lowered_graph(set())  # the check sees the kernel where it is called
    assert "flash_attention" not in lowered_graph({BF16})


def test_hf_sdpa_attention_follows_the_decision(monkeypatch, flash_seen):
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", AttentionInterface._global_mapping["sdpa"])
    _route(monkeypatch, set())
    assert attention.route_hf_attention() is False  # nothing to route: transformers untouched
    _route(monkeypatch, {BF16})
    assert attention.route_hf_attention() and attention.route_hf_attention()  # idempotent
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.autocast("cpu", dtype=BF16):
        model(torch.randint(0, 64, (2, 40))).logits.float().sum().backward()
    model(torch.randint(0, 64, (2, 40)))  # fp32: torch's own choice
    assert flash_seen == [(BF16, False)] * 2 + [(FP32, True)] * 2


def _levels_here() -> list[str]:
    native = torch.backends.cpu.get_cpu_capability()
    return list(LEVELS[: LEVELS.index(native) + 1]) if native in LEVELS else [native]


@pytest.mark.parametrize("level", LEVELS)
def test_bf16_attention_runs_and_matches_fp32_at_every_level(level):
    """The failure itself, where this machine has AMX: bf16 attention and the pretraining loss at each
    kernel level, in a fresh process (the level is fixed when torch loads)."""
    if level not in _levels_here():
        pytest.skip(f"torch cannot raise its kernel level to {level} on this CPU (native "
                    f"{torch.backends.cpu.get_cpu_capability()})")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": level.lower()}
    proc = subprocess.run([sys.executable, "-W", "ignore", str(PROBE)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["level"] == level
    expected = attention.decide(report["flags"], level)
    assert report["routed"] == sorted(str(d) for d in expected)
    for T, gaps in report["attention"].items():
        assert max(gaps.values()) < ATTENTION_TOLERANCE, (T, gaps)
    assert report["lm_loss"] < LOSS_TOLERANCE


def test_every_attention_call_in_src_goes_through_the_routing():
    src = Path(__file__).resolve().parents[1] / "src" / "rlpipe"
    direct = [str(p.relative_to(src)) for p in src.rglob("*.py")
              if "scaled_dot_product_attention(" in p.read_text() and p.name != "attention.py"]
    assert direct == [], f"call rlpipe.lm.attention.sdpa instead of F.scaled_dot_product_attention in {direct}"
