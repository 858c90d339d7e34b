"""The static decode step captured in a CUDA graph once per batch shape and replayed (``decode="cudagraph"``).

A decode step of the ``assignment`` model at batch 64 is a few hundred small kernels; on a GPU the
host launches them more slowly than the chip runs them, so the eager step is launch-bound. Like
gpt-fast and vLLM, this module records the fixed-shape step of ``rlpipe.lm.static_decode`` once per
(N rows, S cache positions, precision) into a ``torch.cuda.CUDAGraph`` and replays it: one launch per
token instead of hundreds.

What a graph needs, and how it is met here:

- fixed addresses: every tensor the step reads or writes lives in ``StaticBuffers``, allocated once
  per shape and kept for the model's life (tokens, RoPE positions, the written cache position, the
  (N, S) key mask, the per-layer K/V cache and the (N, V) logits the step returns). A ``generate``
  call copies its prefilled cache into them (``load``), and each step copies the fed tokens and
  positions in (``step``): device-to-device copies, no host synchronisation;
- no host scalars in the step: the written position ``at`` is a device tensor the step itself
  advances (``at += 1``) and its key-mask column is set on the device (``index_fill_``), so the same
  recorded kernels serve every position;
- warm-up on a side stream before capture (cuBLAS workspaces and lazy initialisation happen outside
  the graph), then one capture in ``thread_local`` error mode (``CAPTURE_ERROR_MODE``: Ray's RDT
  receives run on another thread of the actor); every shape's graph shares one memory pool per
  model (graphs run one at a time on one stream, so their intermediates may share memory;
  persistent buffers are allocated outside the pool);
- under bf16 autocast the capture runs with the autocast weight cache off, so the graph holds the
  weight casts and reads the current fp32 weights on every replay (a cached cast would freeze the
  weights of the capture); weight syncs copy into the parameters in place, and a model whose
  parameters moved (``.to()``, ``load_state_dict(assign=True)``) is captured afresh.

The copy-in / step / copy-out logic (``StaticBuffers``) is device-agnostic: without CUDA it runs the
same buffers through the eager static step (``replay`` is a plain call), which is what the CPU tests
exercise; capture and replay (``_capture``) are the only CUDA-only part, behind ``graphs_available``.
``generate(decode="cudagraph")`` on a CPU model warns once and runs that eager path; the config
refuses ``train.decode: cudagraph`` on ``train.device: cpu`` at parse time, and ``auto`` (the default)
resolves to ``cudagraph`` on CUDA and ``eager`` elsewhere (``resolve_decode``).

The graph replays the static step's kernels, so it samples what ``decode="static"`` samples up to
the float rounding of differently fused kernels (tests compare teacher-forced log-probs).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref

import torch
from torch import Tensor

from rlpipe.lm.model import KVCache, TransformerLM
from rlpipe.lm.static_decode import StaticDecodeAdapter, decode_step, rope_cos_sin

WARMUP_STEPS = 2  # eager runs on the side stream before capture
# Only this thread's calls may not break the capture (torch's default, "global", forbids unsafe CUDA
# calls in every thread of the process). Ray runs a receiving actor's RDT transfers (cuda_ipc's
# IPC-handle opens, NCCL receives) on its own "_ray_system" thread, beside the actor's task: the
# drivers sync weights between rollouts, but a capture no longer depends on that. Inductor's
# CUDA-graph trees capture in the same mode.
CAPTURE_ERROR_MODE = "thread_local"

_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> _ModelGraphs
_WARNED: set[str] = set()


def graphs_available(device: torch.device) -> bool:
    """The one CUDA check: whether steps on ``device`` are captured into CUDA graphs."""
    return device.type == "cuda" and torch.cuda.is_available()


def resolve_decode(decode: str, device: torch.device) -> str:
    """``auto`` -> ``cudagraph`` on a CUDA device, ``eager`` elsewhere; other names unchanged."""
    if decode == "auto":
        return "cudagraph" if graphs_available(torch.device(device)) else "eager"
    return decode


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype in force on ``device``'s type, or None."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None


def capture(fn, pool, amp: torch.dtype | None, device: torch.device) -> tuple[torch.cuda.CUDAGraph, Tensor]:
    """Warm ``fn`` up on a side stream (cuBLAS workspaces and lazy initialisation stay outside the
    graph), then record one call of it into a CUDA graph in ``pool``; returns the graph and the
    output tensor its replays overwrite. Under autocast (``amp``) the weight-cast cache is off, so
    the graph reads the current weights on every replay."""
    def cast():  # a fresh context each time; the caller's autocast, without its weight cache
        return contextlib.nullcontext() if amp is None else torch.autocast(device.type, dtype=amp, cache_enabled=False)

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), cast():
        for _ in range(WARMUP_STEPS):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode=CAPTURE_ERROR_MODE), cast():
        out = fn()
    return graph, out


class StaticBuffers:
    """Every tensor one (N, S) decode step touches, at fixed addresses, and the step over them.

    ``load`` copies a prefilled cache and key mask in, ``step`` copies the fed tokens in and returns
    the (N, V) logits buffer; ``replay`` is ``run`` eagerly, or a captured graph of it (``_capture``).
    """

    def __init__(self, model: TransformerLM, like: KVCache, keys: Tensor):
        self._model = weakref.ref(model)  # the model's entry in _RUNNERS holds these buffers: no cycle
        device = keys.device
        N, S = keys.shape
        self.tok = torch.zeros(N, dtype=torch.long, device=device)  # (N,)
        self.pos = torch.zeros(N, dtype=torch.long, device=device)  # (N,)
        self.at = torch.zeros(1, dtype=torch.long, device=device)  # (1,) the cache position written next
        self.keys = torch.zeros(N, S, dtype=torch.bool, device=device)  # (N, S)
        self.ks = [torch.zeros_like(k) for k in like.k]  # each (N, H, S, Dh)
        self.vs = [torch.zeros_like(v) for v in like.v]
        self.cos, self.sin = rope_cos_sin(model, device)
        self.logits: Tensor | None = None  # (N, V), the step's output
        self.replay = self._eager
        self.graph = None

    def run(self) -> Tensor:
        """One step over the buffers: mark position ``at`` visible, decode, advance ``at``."""
        self.keys.index_fill_(1, self.at, True)
        model = self._model()
        logits = decode_step(model, self.cos, self.sin, self.tok, self.pos, self.at, self.keys, self.ks, self.vs)
        self.at.add_(1)
        return logits  # (N, V)

    def _eager(self) -> Tensor:
        self.logits = self.run()
        return self.logits

    def load(self, cache: KVCache, keys: Tensor, length: int) -> None:
        """Copy a prefilled (N, H, S, Dh) cache and its (N, S) key mask in; the next step writes ``length``."""
        for dst, src in zip((*self.ks, *self.vs), (*cache.k, *cache.v), strict=True):
            dst.copy_(src)
        self.keys.copy_(keys)
        self.at.fill_(length)

    def step(self, tok: Tensor, pos: Tensor) -> Tensor:
        self.tok.copy_(tok)
        self.pos.copy_(pos)
        return self.replay()  # (N, V)

    def _capture(self, pool, amp: torch.dtype | None) -> None:
        """Record ``run`` into a CUDA graph (CUDA only). The buffers' contents are garbage afterwards;
        ``load`` rewrites all of them before any real step."""
        self.graph, self.logits = capture(self.run, pool, amp, self.keys.device)
        self.replay = self._replay

    def _replay(self) -> Tensor:
        self.graph.replay()
        return self.logits


class _ModelGraphs:
    """One model's buffers per shape, the parameter addresses they were captured against, and the
    graph memory pool they share."""

    def __init__(self, model: TransformerLM):
        self.fingerprint = _fingerprint(model)
        self.pool = None
        self.runners: dict[tuple, StaticBuffers] = {}


def _fingerprint(model: TransformerLM) -> tuple:
    return tuple(p.data_ptr() for p in model.parameters())


def runner_for(model: TransformerLM, cache: KVCache, keys: Tensor) -> StaticBuffers:
    """The (captured, on CUDA) ``StaticBuffers`` of this model and shape: built on first use, rebuilt
    when the model's parameters moved."""
    device = keys.device
    graphs = _RUNNERS.get(model)
    if graphs is None or graphs.fingerprint != _fingerprint(model):
        graphs = _RUNNERS[model] = _ModelGraphs(model)
    amp = autocast_dtype(device)
    key = (tuple(keys.shape), cache.k[0].dtype, amp, str(device))
    runner = graphs.runners.get(key)
    if runner is None:
        runner = StaticBuffers(model, cache, keys)
        if graphs_available(device):
            if graphs.pool is None:
                graphs.pool = torch.cuda.graph_pool_handle()
            runner._capture(graphs.pool, amp)
        graphs.runners[key] = runner
    return runner


class CudaGraphDecodeAdapter(StaticDecodeAdapter):
    """The sampler's adapter for ``decode="cudagraph"``: the static adapter's prefill (eager, one
    pass over the prompts), then every step through the shape's ``StaticBuffers``."""

    def __init__(self, model: TransformerLM):
        super().__init__(model, compiled=False)

    def prefill(self, ids: Tensor, mask: Tensor, pos: Tensor, total: int, n: int) -> Tensor:
        if not graphs_available(ids.device) and str(ids.device) not in _WARNED:
            _WARNED.add(str(ids.device))
            warnings.warn(f"decode 'cudagraph' needs a CUDA device; on {ids.device} the static decode step runs "
                          "eagerly over the same buffers (no graph)", RuntimeWarning, stacklevel=3)
        logits = super().prefill(ids, mask, pos, total, n)  # (N, V)
        self.runner = runner_for(self.model, self.cache, self.keys)
        self.runner.load(self.cache, self.keys, self.L)
        self.cache = None  # the runner's buffers hold it now
        return logits

    def step(self, tok: Tensor, pos: Tensor) -> Tensor:
        return self.runner.step(tok, pos)  # (N, V); overwritten by the next step
