"""``rlpipe.lm.device.inductor_cache_per_kernel_level``: torch inductor's cache key does not separate
CPU kernel levels, and kernels cached at one level gave NaN log-probs when reused at another (AVX-512
machine, ``ATEN_CPU_CAPABILITY=avx2``). Every compiled decode keeps one cache per level."""

from __future__ import annotations

import os

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from rlpipe.lm import decode_package, static_decode
from rlpipe.lm.device import INDUCTOR_CACHE_ENV, inductor_cache_per_kernel_level
from rlpipe.lm.model import ModelConfig, TransformerLM

LEVEL = torch.backends.cpu.get_cpu_capability().lower()


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    return monkeypatch


def test_unset_cache_gets_a_directory_of_this_kernel_level(env):
    path = inductor_cache_per_kernel_level()
    assert path == f"{default_cache_dir()}_{LEVEL}" == os.environ[INDUCTOR_CACHE_ENV]


def test_torchs_own_default_is_replaced(env):
    """torch writes its default into the variable the first time it looks (an optimizer step does)."""
    env.setenv(INDUCTOR_CACHE_ENV, default_cache_dir())
    assert inductor_cache_per_kernel_level() == f"{default_cache_dir()}_{LEVEL}"


def test_a_users_choice_is_kept(env, tmp_path):
    env.setenv(INDUCTOR_CACHE_ENV, str(tmp_path))
    assert inductor_cache_per_kernel_level() == str(tmp_path) == os.environ[INDUCTOR_CACHE_ENV]


def test_the_compiled_decode_and_the_aot_build_use_it(env, monkeypatch, tmp_path):
    """Both compile paths call it before compiling (the compiles themselves are tested in
    tests/test_static_decode.py and tests/test_decode_package.py)."""
    calls = []

    def record(where):
        def called():
            calls.append(where)
            raise _Stop
        return called

    monkeypatch.setattr(static_decode, "inductor_cache_per_kernel_level", record("compiled"))
    with pytest.raises(_Stop):
        static_decode._compiled_step(torch.nn.Linear(1, 1))
    monkeypatch.setattr(decode_package, "inductor_cache_per_kernel_level", record("aot"))
    model = TransformerLM(ModelConfig(vocab_size=16, context_length=8, num_layers=1, d_model=8, num_heads=2, d_ff=8))
    with pytest.raises(_Stop):
        decode_package.build(model, tmp_path / "step.pt2")
    assert calls == ["compiled", "aot"]


class _Stop(Exception):
    """Stops a compile right after the cache directory was chosen."""
