"""Scaled dot-product attention for every rlpipe model, routed around a torch CPU kernel that raises.

torch's CPU flash-attention kernel (the SDPA backend torch picks for CPU tensors) decides from the
CPU itself whether to pack its bf16 (or fp16) operands for AMX tiles, then packs them with a routine
compiled once per kernel level that raises below AVX512 (``pack_vnni2 is only supported when avx512
is supported``). On a CPU with AMX run at a lowered level (``ATEN_CPU_CAPABILITY=avx2`` or
``=default``, as the README's test command and the reproducibility page ask), bf16 attention
therefore raises as soon as the sequence is long enough for the kernel to pack (seen at T = 64 on a
Xeon with ``amx_bf16``; T = 8 passed). fp32 never packs; the math backend never packs.

So the decision is made once per process, from the CPU's flags and the level torch runs at
(``decide``), and CPU attention in each affected dtype goes through the math SDPA backend:

| CPU flags                 | torch's level     | CPU dtypes through the math backend |
| ------------------------- | ----------------- | ----------------------------------- |
| no ``amx_tile``           | any               | none                                |
| ``amx_tile``              | ``AVX512``        | none (the kernel's packing exists)  |
| ``amx_tile amx_bf16``     | ``AVX2``/``DEFAULT`` | bfloat16                         |
| ``amx_tile amx_fp16``     | ``AVX2``/``DEFAULT`` | float16                          |

Every other call (CUDA tensors, fp32, a CPU at its native level) goes to torch's own choice
unchanged. The flags come from ``/proc/cpuinfo``, joined by torch's own CPU checks where it has them,
so a kernel that hides the flags cannot hide AMX from the decision: routing a call that would not
have raised costs only speed, missing one raises.

Call sites: ``sdpa`` serves ``TransformerLM`` (pretraining, the learner, the reference, the eager
and KV-cache sampler) and the static decode step (eager, CUDA graph, ``torch.compile`` and AOT
packages, which trace through it); ``route_hf_attention`` puts the same routing in front of
transformers' ``sdpa`` attention for every HF model of the process.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

#: The CPU flag that, with AMX tiles and a level below AVX512, makes each dtype's kernel raise.
AMX_DTYPE_FLAGS = {torch.bfloat16: "amx_bf16", torch.float16: "amx_fp16"}
#: torch's CPU kernel level at which the flash kernel's AMX packing is compiled in.
PACKING_LEVEL = "AVX512"


def decide(flags: Iterable[str], level: str) -> frozenset[torch.dtype]:
    """The CPU dtypes whose attention must take the math backend, given the CPU's ``flags`` (as in
    ``/proc/cpuinfo``) and torch's kernel ``level`` (``torch.backends.cpu.get_cpu_capability()``)."""
    flags = set(flags)
    if "amx_tile" not in flags or level.upper() == PACKING_LEVEL:
        return frozenset()
    return frozenset(dtype for dtype, flag in AMX_DTYPE_FLAGS.items() if flag in flags)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags: the first ``flags`` line of ``/proc/cpuinfo``, joined by the AMX
    flags torch's own CPU checks report (its private helpers, used where this torch has them)."""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        with cpuinfo.open() as f:
            line = next((line for line in f if line.startswith("flags")), "")
        flags = set(line.partition(":")[2].split())
    # torch's AMX tile check is oneDNN's avx512_core_amx, the bf16 one
    checks = {("amx_tile", "amx_bf16"): "_is_amx_tile_supported", ("amx_fp16",): "_is_amx_fp16_supported"}
    for names, check in checks.items():
        with contextlib.suppress(Exception):
            if getattr(torch.cpu, check)():
                flags.update(names)
    return flags


#: This process's decision (``decide`` on this CPU and level), made once at import: a module
#: constant, so that ``torch.compile`` and ``torch.export`` read it as one without tracing a file read.
MATH_DTYPES: frozenset[torch.dtype] = decide(cpu_flags(), torch.backends.cpu.get_cpu_capability())


def math_dtypes() -> frozenset[torch.dtype]:
    """This process's decision: the CPU dtypes whose attention takes the math backend."""
    return MATH_DTYPES


def describe() -> str:
    """One line for logs and CI: the AMX flags seen, torch's level, and what is routed."""
    flags = cpu_flags()
    amx = " ".join(sorted(f for f in flags if f.startswith("amx") or f == "avx512_bf16")) or "none"
    routed = ", ".join(sorted(str(d).removeprefix("torch.") for d in math_dtypes())) or "nothing"
    return (f"AMX/AVX512-BF16 flags: {amx}; torch kernel level {torch.backends.cpu.get_cpu_capability()}; "
            f"CPU attention through the math backend: {routed}")


def needs_math(q: Tensor) -> bool:
    """Whether this call must take the math backend: a CPU query whose attention runs in a dtype that
    ``math_dtypes`` holds. Under CPU autocast, SDPA runs in the autocast dtype whatever the fp32
    inputs' own (torch lists it among autocast's lower-precision ops), so that dtype is the one
    that counts; transformers' rotary embedding, for one, hands SDPA fp32 queries under bf16 autocast."""
    if not MATH_DTYPES or q.device.type != "cpu":
        return False
    dtype = q.dtype
    if dtype == torch.float32 and torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
    return dtype in MATH_DTYPES


def sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal)``, through the math backend
    where this CPU's flash kernel would raise (``math_dtypes``). Shapes: q (B, H, T, Dh), k and v
    (B, H, S, Dh), out (B, H, T, Dh)."""
    with backend_for(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def backend_for(q: Tensor):
    """The math backend's context where ``needs_math(q)``, else one that changes nothing."""
    return sdpa_kernel(SDPBackend.MATH) if needs_math(q) else contextlib.nullcontext()


def route_hf_attention() -> bool:
    """Put ``sdpa``'s routing in front of transformers' ``sdpa`` attention, for every HF model of this
    process, where ``math_dtypes`` is not empty; returns whether it did (idempotent; transformers is
    left untouched elsewhere)."""
    if not math_dtypes():
        return False
    from transformers import AttentionInterface

    current = AttentionInterface._global_mapping["sdpa"]
    if getattr(current, "rlpipe_routed", False):
        return True

    @functools.wraps(current)
    def routed(module, query, *args, **kwargs):
        with backend_for(query):
            return current(module, query, *args, **kwargs)

    routed.rlpipe_routed = True
    AttentionInterface.register("sdpa", routed)
    return True
