"""The AOT-compiled decode step (``rlpipe.lm.decode_package``, ``decode="aot"``) against the eager
model by teacher forcing (naive vs optimised), its cache, and its errors. One package is built for the tiny base
model (tens of seconds: export and a C++ compile) into the session's cache (``decode_cache``),
where the trainer's aot test finds it."""

from __future__ import annotations

import json

import pytest
import torch

from rlpipe.config import ConfigError, TrainConfig
from rlpipe.lm import decode_package
from rlpipe.lm.policy import load_policy
from rlpipe.trainer.run import prepare_decode_package

# Largest |recorded - teacher-forced| log-prob (tests/kernel_tolerance.py; ``decode_check``: the
# package's log-probs against one eager forward over its own tokens), the session's micro model,
# 5 seeds x 32 rows x 40 tokens, with and without stop strings and min_tokens: 1.9e-6 natively
# (AVX-512) and with ATEN_CPU_CAPABILITY=avx2, 2.9e-6 with =default; the tolerance is 35x the largest.
# Tokens are never compared with the eager sampler's: a draw within that rounding of a CDF step may
# pick another token on another CPU.
LOGPROB_TOL = 1e-4


pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning"),  # torch.export's and torch.jit's own
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def cache(decode_cache):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(decode_package, "_LOADED", {})
        yield decode_cache


@pytest.fixture(scope="module")
def policy(tiny_base, cache):
    policy = load_policy(tiny_base[0])
    decode_package.load(policy.model)  # builds once for the module
    return policy


def test_aot_step_samples_what_the_eager_sampler_samples(policy, decode_check):
    decode_check.against_eager(policy, "aot", LOGPROB_TOL)


def test_one_package_serves_every_batch_shape(policy, decode_check):
    """N and S are dynamic: other row counts and cache lengths, and N = 1 (the eager static step)."""
    decode_check.against_eager(policy, "aot", LOGPROB_TOL, n=1)
    long = [p * 3 for p in decode_check.PROMPTS]  # a longer cache bucket
    decode_check.against_eager(policy, "aot", LOGPROB_TOL, prompts=long, n=2)
    decode_check.against_eager(policy, "aot", LOGPROB_TOL, prompts=decode_check.PROMPTS[:1], n=1)


def test_aot_step_with_stop_strings_and_min_tokens(policy, decode_check):
    kw = dict(stop=("was",), include_stop_str_in_output=True, min_tokens=2)
    decode_check.against_eager(policy, "aot", LOGPROB_TOL, **kw)


def test_the_package_reads_the_current_weights(policy, decode_check):
    """Weights are inputs, not constants of the package: an in-place update (what the optimizer does)
    is seen by the next call."""
    model = policy.model
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        decode_check.against_eager(policy, "aot", LOGPROB_TOL)
    finally:
        model.load_state_dict(saved)


def test_the_package_is_cached_on_disk_and_reloaded_without_a_build(policy, cache, monkeypatch):
    path = decode_package.package_path(policy.model)
    assert path.parent == cache and path.exists()
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["model"] == policy.model.config.to_dict() and meta["torch"] == torch.__version__
    assert decode_package.load(policy.model) is decode_package.load(policy.model)  # once per process
    monkeypatch.setattr(decode_package, "_LOADED", {})
    monkeypatch.setattr(decode_package, "build", lambda *a, **k: pytest.fail("rebuilt a cached package"))
    assert decode_package.load(policy.model, build_missing=False).path == path


def test_the_key_names_the_model_shape_and_the_torch_build(policy, monkeypatch):
    path = decode_package.package_path(policy.model)
    other = type(policy.model)(policy.model.config.replace(num_layers=policy.model.config.num_layers + 1))
    assert decode_package.package_path(other) != path
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert decode_package.package_path(policy.model) != path


def test_a_missing_package_names_the_command_that_builds_it(policy, tmp_path, monkeypatch):
    monkeypatch.setenv(decode_package.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(decode_package, "_LOADED", {})
    with pytest.raises(decode_package.DecodePackageError, match="rlpipe build-decode"):
        decode_package.load(policy.model, build_missing=False)


def test_a_damaged_package_is_an_error_that_says_to_delete_it(policy, tmp_path, monkeypatch):
    monkeypatch.setenv(decode_package.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(decode_package, "_LOADED", {})
    decode_package.package_path(policy.model).write_bytes(b"not a package")
    with pytest.raises(decode_package.DecodePackageError, match="delete it to rebuild"):
        decode_package.load(policy.model)


def test_a_package_that_disagrees_with_the_eager_step_is_refused(policy, monkeypatch):
    package = decode_package.load(policy.model)
    monkeypatch.setattr(package, "runner", _Wrong(package.runner))
    with pytest.raises(decode_package.DecodePackageError, match="disagrees with the eager step"):
        package.check(policy.model)


class _Wrong:
    def __init__(self, runner):
        self.runner = runner

    def boxed_run(self, flat):
        return [self.runner.boxed_run(flat)[0] + 1.0]


def test_only_float32_transformer_lm_on_cpu(policy):
    with pytest.raises(decode_package.DecodePackageError, match="float32 on CPU"):
        decode_package.check_model(type(policy.model)(policy.model.config).to(torch.bfloat16))
    with pytest.raises(decode_package.DecodePackageError, match="TransformerLM only"):
        decode_package.check_model(torch.nn.Linear(2, 2))


def test_rlpipe_train_refuses_aot_outside_float32_cpu(tiny_base):
    cfg = TrainConfig(decode="aot", device="cpu", dtype="bfloat16")
    with pytest.raises(ConfigError, match="train.decode: aot runs float32 on CPU"):
        prepare_decode_package(cfg, tiny_base[0])


def test_rlpipe_train_prepares_the_package_before_ray(policy, tiny_base, monkeypatch):
    monkeypatch.setattr(decode_package, "_LOADED", {})
    monkeypatch.setattr(decode_package, "build", lambda *a, **k: pytest.fail("rebuilt a cached package"))
    prepare_decode_package(TrainConfig(decode="aot", device="cpu"), tiny_base[0])
    assert len(decode_package._LOADED) == 1
    prepare_decode_package(TrainConfig(decode="eager", device="cpu"), tiny_base[0])  # a no-op


def test_build_decode_command(policy, tiny_base, tmp_path, capsys):
    assert decode_package.main(["--checkpoint", tiny_base[0]]) == 0
    assert "cached" in capsys.readouterr().out
    assert decode_package.main(["--checkpoint", str(tmp_path / "nope.pt")]) == 2
    assert "--checkpoint" in capsys.readouterr().err


def test_bench_trl_finds_the_package_before_its_pairs(policy, tiny_base):
    from rlpipe.bench.trl import prepare_decode
    from rlpipe.bench.trl_settings import BenchSettings

    found = prepare_decode(tiny_base[0], BenchSettings(decode="aot"), "native")
    assert found == {"package": str(decode_package.package_path(policy.model)), "built_here": False, "build_s": None}
    assert prepare_decode(tiny_base[0], BenchSettings(decode="aot"), "hf") is None  # HF decodes eagerly
    assert prepare_decode(tiny_base[0], BenchSettings(decode="eager"), "native") is None


def test_two_builders_of_one_package_build_it_once(policy, tmp_path, monkeypatch):
    """The second job waits on the build lock, then finds the package (what two Snakemake jobs on
    one machine do)."""
    import threading
    import time

    builds = []

    def slow_build(model, path):
        builds.append(path)
        time.sleep(0.3)
        path.write_bytes(b"package")
        return path, 0.3

    monkeypatch.setattr(decode_package, "build", slow_build)
    path = tmp_path / "decode-x.pt2"
    results = []
    workers = [threading.Thread(target=lambda: results.append(decode_package.ensure_built(policy.model, path)))
               for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert builds == [path] and sorted(results, key=str) == [0.3, None]
