"""The static decode step compiled ahead of time (AOTInductor), built once per model shape and machine.

``torch.compile`` (``decode="compiled"``) pays its compilation in every process, for every batch
shape: seconds to tens of seconds, more than a short GRPO run saves. Here the same step
(``rlpipe.lm.static_decode.decode_step``) is exported once with ``torch.export`` and compiled by
AOTInductor into a ``.pt2`` package whose C++ wrapper calls the kernels without Python in between:

- the weights are inputs of the step, not constants baked into the package, so one package serves
  every checkpoint of one ``ModelConfig`` and always reads the current weights (the optimizer
  updates them in place between steps);
- the batch size N and the cache length S are dynamic, so training, validation and evaluation
  batches share one package;
- packages live in a cache directory (``$RLPIPE_DECODE_CACHE``, default ``~/.cache/rlpipe/decode``)
  under a key of the model config, the torch version, the CPU capability, the CPU attention routing
  (``rlpipe.lm.attention``) and this step's version:
  a package is never loaded on a machine or torch it was not built for. A build writes to a
  temporary file and renames it, so concurrent builders never leave a half-written package;
- loading is the C++ package loader alone (milliseconds); a loaded package is checked once against
  the eager step on a small batch before it is used, so a package that does not match this code
  fails loudly instead of sampling from wrong logits.

Departures, and why: CPU and float32 only (the weights-as-inputs package was built and tested on
CPU; a CUDA machine uses ``decode="compiled"``); N = 1 runs the eager static step (export
specialises size-1 dimensions). The logits agree with the eager step to float rounding (about
1e-5), so sampled tokens match the eager sampler's except where two tokens' probabilities tie to
that precision (``tests/test_decode_package.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from rlpipe.lm.attention import math_dtypes
from rlpipe.lm.checkpoint import CheckpointError, load_checkpoint
from rlpipe.lm.device import inductor_cache_per_kernel_level
from rlpipe.lm.model import TransformerLM
from rlpipe.lm.static_decode import decode_step, rope_cos_sin

try:
    import fcntl
except ImportError:  # not POSIX: builds are not serialised
    fcntl = None

CACHE_ENV = "RLPIPE_DECODE_CACHE"
STEP_VERSION = 1  # bump when decode_step's signature or semantics change: old packages are then ignored
CHECK_TOLERANCE = 1e-3  # max |logit difference| against the eager step at load (measured about 1e-5)

_LOADED: dict[str, DecodePackage] = {}


class DecodePackageError(RuntimeError):
    """A decode package cannot be built or loaded here; the message says why and what to use instead."""


def cache_dir() -> Path:
    """Where packages are kept: ``$RLPIPE_DECODE_CACHE``, else ``~/.cache/rlpipe/decode``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rlpipe" / "decode")


def package_key(model: TransformerLM) -> dict:
    """Everything a package depends on besides the weights."""
    return {"model": model.config.to_dict(), "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "step_version": STEP_VERSION,
            "dtype": "float32", "device": "cpu",
            "attention_math": sorted(str(d) for d in math_dtypes())}


def package_path(model: TransformerLM, directory: Path | None = None) -> Path:
    key = json.dumps(package_key(model), sort_keys=True)
    name = hashlib.sha256(key.encode()).hexdigest()[:20]
    return (directory or cache_dir()) / f"decode-{name}.pt2"


def check_model(model) -> TransformerLM:
    """``model`` if the package can decode it, else ``DecodePackageError`` naming what is wrong."""
    base = getattr(model, "_orig_mod", model)
    if not isinstance(base, TransformerLM):
        raise DecodePackageError(f"decode='aot' drives rlpipe's TransformerLM only, got {type(base).__name__}; "
                                 "HF policies decode eagerly")
    p = next(base.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        raise DecodePackageError(f"decode='aot' runs float32 on CPU; this model is {p.dtype} on {p.device}. "
                                 "Use train.decode: compiled (torch.compile) on an accelerator")
    return base


class _Step(nn.Module):
    """``decode_step`` with the weights as a list input (``torch.func.functional_call``)."""

    def __init__(self, model: TransformerLM):
        super().__init__()
        self.names = [n for n, _ in model.named_parameters()]
        self.inner = _Bound(model)

    def forward(self, params: list[Tensor], cos, sin, tok, pos, at, keys, ks, vs) -> Tensor:
        weights = {f"model.{n}": p for n, p in zip(self.names, params, strict=True)}
        return torch.func.functional_call(self.inner, weights, (cos, sin, tok, pos, at, keys, ks, vs))


class _Bound(nn.Module):
    def __init__(self, model: TransformerLM):
        super().__init__()
        self.model = model

    def forward(self, cos, sin, tok, pos, at, keys, ks, vs) -> Tensor:
        return decode_step(self.model, cos, sin, tok, pos, at, keys, ks, vs)


def _example(model: TransformerLM, N: int, S: int, seed: int = 0) -> tuple:
    """Step inputs for an (N, S) batch: random tokens, positions, key mask and cache."""
    cfg, g = model.config, torch.Generator().manual_seed(seed)
    at = torch.tensor([S // 2])
    keys = torch.rand(N, S, generator=g) > 0.3  # (N, S)
    keys[:, at] = True
    ks = [torch.randn(N, cfg.num_heads, S, cfg.head_dim, generator=g) for _ in range(cfg.num_layers)]
    vs = [torch.randn(N, cfg.num_heads, S, cfg.head_dim, generator=g) for _ in range(cfg.num_layers)]
    return (*rope_cos_sin(model, "cpu"), torch.randint(0, cfg.vocab_size, (N,), generator=g),
            torch.randint(0, S, (N,), generator=g), at, keys, ks, vs)


def build(model, path: Path | None = None) -> tuple[Path, float]:
    """Export and compile ``model``'s decode step to ``path`` (default: its cache path); returns the
    path and the seconds it took. Atomic: the package appears complete or not at all."""
    base = check_model(model)
    path = Path(path or package_path(base))
    path.parent.mkdir(parents=True, exist_ok=True)
    inductor = importlib.import_module("torch._inductor")  # loaded only when a package is built
    inductor_cache_per_kernel_level()

    cfg, t0 = base.config, time.perf_counter()
    params = [p.detach() for p in base.parameters()]
    args = (params, *_example(base, 32, min(64, cfg.context_length)))
    n, s = torch.export.Dim("N", min=2, max=1 << 16), torch.export.Dim("S", min=2, max=cfg.context_length)
    cache = [{0: n, 2: s}] * cfg.num_layers
    dynamic = ([None] * len(params), None, None, {0: n}, {0: n}, None, {0: n, 1: s}, cache, cache)
    fd, tmp = tempfile.mkstemp(suffix=".pt2", dir=path.parent)
    os.close(fd)
    try:
        with torch.no_grad():
            program = torch.export.export(_Step(base).eval(), args, dynamic_shapes=dynamic, strict=False)
            inductor.aoti_compile_and_package(program, package_path=tmp)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache's package from other users
        os.replace(tmp, path)
    except Exception as e:  # any compiler failure becomes one clear message
        Path(tmp).unlink(missing_ok=True)
        raise DecodePackageError(f"building the AOT decode package failed ({type(e).__name__}: {str(e)[:300]}). "
                                 "It needs a C++ compiler; train.decode: eager needs none") from e
    seconds = time.perf_counter() - t0
    meta = {**package_key(base), "build_seconds": round(seconds, 2)}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    return path, seconds


@contextlib.contextmanager
def _build_lock(path: Path):
    """An exclusive lock on ``<package>.lock`` (POSIX ``flock``; none elsewhere), so that two jobs
    wanting the same package build it once: the second waits, then finds it."""
    if fcntl is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".lock"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def ensure_built(model, path: Path) -> float | None:
    """Build the package at ``path`` unless it exists, under the build lock; the build's seconds,
    or None when it was already there."""
    with _build_lock(path):
        if path.exists():
            return None
        return build(model, path)[1]


@dataclass
class DecodePackage:
    """A loaded package: ``step(model, cos, sin, tok, pos, at, keys, ks, vs)`` like ``decode_step``."""

    path: Path
    runner: object

    def step(self, model: TransformerLM, cos, sin, tok, pos, at, keys, ks, vs) -> Tensor:
        if tok.shape[0] < 2:  # export specialises size-1 dimensions: the eager step takes N = 1
            return decode_step(model, cos, sin, tok, pos, at, keys, ks, vs)
        flat = [*model.parameters(), cos, sin, tok, pos, at, keys, *ks, *vs]
        return self.runner.boxed_run([t.detach() for t in flat])[0]  # (N, V); ks, vs written in place

    def check(self, model: TransformerLM) -> float:
        """Max |logits - eager step's| on a small random batch; ``DecodePackageError`` above the tolerance."""
        a, b = _example(model, 3, 8, seed=1), _example(model, 3, 8, seed=1)
        with torch.inference_mode():
            got, want = self.step(model, *a), decode_step(model, *b)
        err = float((got - want).abs().max())
        cache_err = max(float((x - y).abs().max()) for x, y in zip(a[6] + a[7], b[6] + b[7], strict=True))
        if not err <= CHECK_TOLERANCE or not cache_err <= CHECK_TOLERANCE:
            raise DecodePackageError(f"the decode package {self.path} disagrees with the eager step (max |logit "
                                     f"diff| {err:.3g}, cache {cache_err:.3g}); delete it to rebuild")
        return err


def _open(path: Path):
    try:
        return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    except AttributeError:  # a torch without the raw loader: the public one (imports inductor, seconds)
        return importlib.import_module("torch._inductor").aoti_load_package(str(path)).loader


def load(model, *, build_missing: bool = True) -> DecodePackage:
    """The package for ``model`` on this machine, from this process's memory, the cache directory, or
    (``build_missing``) a new build. Checked against the eager step once per process and path."""
    base = check_model(model)
    path = package_path(base)
    key = str(path)
    if key in _LOADED:
        return _LOADED[key]
    if not path.exists():
        if not build_missing:
            raise DecodePackageError(f"no AOT decode package for this model at {path}; build it with "
                                     "`rlpipe build-decode --checkpoint CKPT`")
        ensure_built(base, path)
    try:
        package = DecodePackage(path, _open(path))
    except RuntimeError as e:
        raise DecodePackageError(f"cannot load the decode package {path} ({str(e)[:200]}); delete it to rebuild") from e
    package.check(base)
    _LOADED[key] = package
    return package


def main(argv: list[str] | None = None) -> int:
    """``rlpipe build-decode --checkpoint CKPT``: build (or find) the package for a checkpoint's model shape."""
    ap = argparse.ArgumentParser(prog="rlpipe build-decode", description="Build the AOT decode package "
                                 "(train.decode: aot) for a checkpoint's model shape on this machine.")
    ap.add_argument("--checkpoint", required=True, help="an rlpipe checkpoint (.pt); only its model config matters")
    ap.add_argument("--force", action="store_true", help="rebuild even when the cache has the package")
    a = ap.parse_args(argv)
    try:
        model = load_checkpoint(a.checkpoint, device="cpu").model
    except (FileNotFoundError, CheckpointError) as e:
        print(f"rlpipe build-decode: --checkpoint: {e}", file=sys.stderr)
        return 2
    try:
        path = package_path(check_model(model))
        seconds = build(model, path)[1] if a.force else ensure_built(model, path)
        print(f"cached {path}" if seconds is None else f"built {path} in {seconds:.1f} s")
        load(model, build_missing=False)
    except DecodePackageError as e:
        print(f"rlpipe build-decode: {e}", file=sys.stderr)
        return 1
    return 0
