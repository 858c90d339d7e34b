"""Fixtures shared by the test modules (tests never import each other: shared helpers live here).

- ``ray_session``: one local Ray instance for every trainer test.
- ``decode_check``: samples a policy with one ``generate`` decode and checks its samples against the
  eager model by teacher forcing on the same tokens (tests/test_static_decode.py and
  tests/test_decode_package.py); never token for token across decodes, which run other kernels.
- ``decode_cache``: the run's AOT decode-package directory, shared by the pytest-xdist workers (autouse:
  set before Ray starts).
- ``shared_dir`` / ``build_once``: a directory every xdist worker of the run shares, and something built
  into one once per run, whichever worker asks first (the others wait and reuse it); with
  ``across_sessions``, once for the README command's two sessions (``SESSION_BUILDS``); the
  ``built_once`` fixture hands ``build_once`` to a test module.
- ``smoke_run``: the one smoke workflow run of the suite (``config/smoke.yaml`` with the built-in tracks
  and the worked example's track, its report), read by tests/test_workflow_smoke.py,
  tests/test_example_workflow.py and tests/test_slurm.py; through SLURM where its test cluster is up.
- ``cluster`` / ``slurm_smoke``: the test SLURM cluster (tests/slurm_harness.py) and the smoke run
  through it (tests/test_slurm.py, tests/test_slurm_multinode.py).
- ``digest_cache``: the session's cache of the run fingerprint's file digests (autouse).
- ``tiny_base``: a briefly trained micro TransformerLM and a keyword dataset (trainer tests).
- ``write_config`` / ``make_dataset`` / ``make_base``: factories for trainer configs, keyword datasets
  and micro base models.
- ``make_runs``: synthetic ``results/runs/<variant>/`` directories with hand-computed numbers
  (documented in tests/test_aggregate.py, whose expected values depend on them).
- ``dry_run``: reads the jobs a ``snakemake -n`` printout plans (rule, wildcards, resources).
- ``run_snakemake``: ``run_snakemake(workdir, *args, check=True)`` runs the project's Snakefile in
  ``workdir`` (a failure, when checked, raises with its output's tail).
- ``live_processes``: ``live_processes(procs)``: those of the psutil processes still running, zombies
  left out.
- ``one_torch_thread``: one intra-op thread for a module of tiny-model tests.
- ``flip_tensor_bytes``: ``flip_tensor_bytes(path, n=400)`` inverts ``n`` bytes in the middle of the
  largest tensor stored in a checkpoint file, leaving the zip structure intact (a bit-rotted file).
- ``learning``: the seed offset and the recorder of learning tests (``pytest -m learning``); see
  ``tests/learning_noise.py``, which runs them over seeds and CPU kernels to measure their noise.
- ``tiny_qwen``: a tiny random-init ``Qwen2ForCausalLM`` directory (own BPE, tied embeddings, no
  download), briefly trained on r1_zero answers to the MATH fixture (``MATH_FIXTURE``), so that its
  samples sometimes earn reward.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from rlpipe import contract
from rlpipe.lm.sampler import SamplingParams, generate
from user_env import activated_env

MATH_FIXTURE = Path(__file__).parent / "data" / "math_fixture"
ROOT = Path(__file__).resolve().parents[1]
WORDS = ["cat", "dog", "apple", "tree", "ball", "house", "moon", "fish", "bird", "cake", "boat", "hat"]


def worker_threads(workers: int) -> int | None:
    """Torch intra-op threads for each of ``workers`` pytest-xdist workers: its share of the CPUs, at
    least one; None where ``share_the_cores`` leaves torch as it is (no xdist, or ``OMP_NUM_THREADS``
    set by the user)."""
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    return max(1, (os.cpu_count() or 1) // workers)


def share_the_cores() -> None:
    """Under pytest-xdist (the README's ``-n 2``), a worker takes its share of the CPUs for torch's
    intra-op threads (``worker_threads``), and its children wait passively (``OMP_WAIT_POLICY``).

    Torch's default is one thread per core in every process. Two workers, each with a Snakemake run,
    ``rlpipe train`` subprocesses or Ray actors beside it, then ask for several times the cores there
    are, and OpenMP threads that spin at each barrier while the thread they wait for is descheduled
    make a tiny model's loop several times slower than one thread would be (``tiny_base``'s weights
    come out the same bits with one thread or two). A child sets its own thread count
    (``train.threads``, a rule's threads); ``OMP_WAIT_POLICY=PASSIVE`` makes its waiting threads sleep
    instead of spinning on a core another process needs. Neither where the user set
    ``OMP_NUM_THREADS``, nor without xdist, where nothing of the suite runs beside a test."""
    threads = worker_threads(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    if threads is not None:
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


share_the_cores()


def pytest_report_header(config) -> str:
    """Where the suite ran: the CPU kernels torch uses here (``ATEN_CPU_CAPABILITY`` can lower the
    level, never raise it), so a result names the numerics it was measured with."""
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   cpu)
    forced = os.environ.get("ATEN_CPU_CAPABILITY")
    workers = config.getoption("numprocesses", None)
    share = worker_threads(workers) if isinstance(workers, int) else None
    threads = f"; torch threads per xdist worker: {share} (share_the_cores)" if share is not None else ""
    from rlpipe.lm.attention import describe

    return (f"torch {torch.__version__} CPU kernels: {torch.backends.cpu.get_cpu_capability()}"
            f" (ATEN_CPU_CAPABILITY={forced or 'unset'}) on {cpu}{threads}\n{describe()}")


#: Test files that form one pytest-xdist work unit together (else each file is its own unit): the smoke,
#: example-track and SLURM tests read one smoke workflow run (``smoke_run``, made through SLURM in CI),
#: and the SLURM tests share one test cluster, whose two nodes one of their runs may fill.
SHARED_UNITS = {"tests/test_slurm.py": "smoke", "tests/test_slurm_multinode.py": "smoke",
                "tests/test_workflow_smoke.py": "smoke", "tests/test_example_workflow.py": "smoke"}
#: A rough cost in seconds of one test, by its costliest marker (a Snakemake run, a Ray run, a dry
#: run, a learning test; else short). A unit's estimate is the sum over its tests. Units go out with
#: Snakemake runs first (the longest single tests), then costliest first, so that the many short ones
#: fill in behind the long ones rather than a long one starting last, alone.
MARKER_COST_S = {"workflow": 60.0, "ray": 15.0, "learning": 10.0, "dag": 5.0}
OTHER_COST_S = 0.2


def work_unit(nodeid: str) -> str:
    """The pytest-xdist work unit of a test: its file, or its ``SHARED_UNITS`` name."""
    path = nodeid.split("::", 1)[0]
    return SHARED_UNITS.get(path, path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Units run in the order ``MARKER_COST_S`` gives (pytest's order within a unit stays); without
    xdist only the order of the files changes."""
    def cost(item) -> float:
        return max((c for m, c in MARKER_COST_S.items() if item.get_closest_marker(m)), default=OTHER_COST_S)

    units = [work_unit(item.nodeid) for item in items]
    unit_cost: dict[str, float] = {}
    runs_snakemake: set[str] = set()
    for u, item in zip(units, items, strict=True):
        unit_cost[u] = unit_cost.get(u, 0.0) + cost(item)
        if item.get_closest_marker("workflow"):
            runs_snakemake.add(u)
    first_seen = {u: i for i, u in reversed(list(enumerate(units)))}
    order = {id(item): (u not in runs_snakemake, -unit_cost[u], first_seen[u])
             for u, item in zip(units, items, strict=True)}
    items.sort(key=lambda item: order[id(item)])


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (the README's ``-n 2``): whole units to a worker (``work_unit``: a file's
    module fixtures, a pretrained model or a Snakemake run, are built once; the SLURM files share a
    worker), in the collection's order. xdist's own ``loadgroup`` cannot do this here: it renames
    tests through an attribute pytest 9 no longer reads, so every test became its own unit."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def schedule(self) -> None:
            self.config.option.loadscopereorder = False  # keep the order the collection hook gave
            super().schedule()

    return WorkUnits(config, log)


def _make_tokenizer(path: Path):
    from rlpipe.lm.tokenizer import train_bpe

    rng = random.Random(0)
    texts = []
    for _ in range(300):
        w = rng.sample(WORDS, 3)
        texts.append(f"Write a story that includes the word: {w[0]}\nOnce upon a time a {w[1]} saw a {w[2]}. "
                     f"The {w[0]} was happy.<|endoftext|>")
    return train_bpe(texts, 400, path)


def _make_base(tmp: Path, pretrain_steps: int = 300, **model_overrides) -> tuple[Path, Path]:
    """(checkpoint path, tokenizer path) of a micro TransformerLM briefly trained on keyword
    stories, so that its responses sometimes contain the keyword (rewards have variance and GRPO
    has a gradient)."""
    from rlpipe.lm.checkpoint import save_checkpoint
    from rlpipe.lm.model import ModelConfig, TransformerLM

    tok = _make_tokenizer(tmp / "tokenizer.json")
    torch.manual_seed(0)
    overrides = dict(vocab_size=tok.vocab_size, num_layers=2, d_model=32, num_heads=2, d_ff=64,
                     context_length=128) | model_overrides
    model = TransformerLM(ModelConfig.from_preset("cpu-tiny", **overrides))
    rng = random.Random(1)
    docs = []
    for _ in range(200):
        w = rng.sample(WORDS, 2)
        hit = w[0] if rng.random() < 0.5 else w[1]
        docs += tok.encode(f"Write a story that includes the word: {w[0]}\nThe {hit} was happy.") + [tok.eos_token_id]
    data = torch.tensor(docs)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(pretrain_steps):
        starts = torch.randint(0, len(data) - 33, (16,))
        x = torch.stack([data[s:s + 33] for s in starts])  # (B, 33)
        logits = model(x[:, :-1])  # (B, 32, V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_checkpoint(tmp / "base.pt", model, tokenizer=str(tmp / "tokenizer.json"))
    return tmp / "base.pt", tmp / "tokenizer.json"


def _make_dataset(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for split, words in (("train", WORDS[:9]), ("val", WORDS[6:])):
        with open(d / f"{split}.jsonl", "w") as f:
            for w in words:
                f.write(json.dumps({"prompt": f"Write a story that includes the word: {w}\n", "keywords": [w]}) + "\n")
    return d


BASE_TRAIN = {
    "n_grpo_steps": 2, "rollout_batch_size": 8, "group_size": 4, "train_batch_size": 8,
    "sampling_max_tokens": 8, "val_size": 3, "val_every": 1, "log_rollouts_every": 1,
    "checkpoint_every": 1, "device": "cpu", "threads": 1, "learning_rate": 1e-2, "ray_timeout_s": 120.0,
}

VARIANTS = {
    "onpolicy": {"mode": "colocated_sync"},
    "k1": {"mode": "colocated_k", "k": 1},
    "k2": {"mode": "colocated_k", "k": 2, "n_grpo_steps": 4},
    "k4": {"mode": "colocated_k", "k": 4, "n_grpo_steps": 4},
    "disagg": {"mode": "disaggregated", "n_grpo_steps": 6},
    "disagg_rdt": {"mode": "disaggregated", "weight_sync.transport": "rdt", "n_grpo_steps": 3},
    "disagg_channel": {"mode": "disaggregated", "weight_sync.channel": True, "n_grpo_steps": 3},
    "disagg_fresh": {"mode": "disaggregated", "weight_sync.channel": False, "n_grpo_steps": 3},
    "replay": {"mode": "disaggregated", "replay.enabled": True, "replay.max_age": 2, "n_grpo_steps": 4},
    "scorer": {"mode": "disaggregated", "scorer_actor": True, "n_grpo_steps": 2},
    "lag3": {"mode": "disaggregated", "policy_lag": 3, "n_grpo_steps": 6},
    "kl_penalty": {"mode": "colocated_sync", "kl_coef": 0.1},
}


def _write_config(path: Path, train: dict | None = None, variants: dict | None = None, **sections) -> Path:
    cfg = {"train": BASE_TRAIN | (train or {}), "variants": variants or VARIANTS,
           "workflow": {"threads_per_variant": 2}} | sections
    path.write_text(yaml.safe_dump(cfg))
    return path



class DecodeCheck:
    """Sample ``PROMPTS`` (uneven: left padding) with a given decode, and check that the samples are
    the eager model's: the log-probs each decode recorded equal the eager full-sequence forward's
    teacher-forced log-probs of the *same* tokens, within ``tol``.

    Two decodes run different kernels (eager, static, compiled, AOT, CUDA graph), whose logits agree
    only to rounding, so a draw that lands within that rounding of a CDF step picks another token on
    some CPU (AVX-512 did, on a 7-step run). They are therefore never compared token for token:
    each is compared with the model on its own tokens. Exact equality is asserted only between two
    calls of the same decode (same kernels, same seed)."""

    PROMPTS = ["Write a story that includes the word: cat\n", "Write a story", "The dog"]
    TEMPERATURE = 0.9

    @classmethod
    def sample(cls, policy, decode: str, prompts=None, n: int = 3, **kw):
        params = SamplingParams(n=n, temperature=cls.TEMPERATURE, max_tokens=12, seed=7, **kw)
        return generate(policy.model, policy.tokenizer, prompts or cls.PROMPTS, params, decode=decode)

    @staticmethod
    def teacher_forced(model, prompt_ids, response_ids, temperature: float, min_tokens: int = 0,
                       eos: int | None = None, top_p: float = 1.0) -> torch.Tensor:
        """(T,) log-probs of ``response_ids`` after ``prompt_ids`` from one eager forward over the whole
        sequence, under the distribution the sampler draws from: ``logits / T`` (T = 1 for greedy),
        EOS masked at the first ``min_tokens`` positions, renormalised over the nucleus for
        ``top_p < 1`` (a token outside its nucleus gets -inf). HF models' outputs are read by ``.logits``."""
        ids = torch.tensor(list(prompt_ids) + list(response_ids))[None]  # (1, T_p + T)
        with torch.no_grad():
            out = model(ids)
            logits = getattr(out, "logits", out)[0, len(prompt_ids) - 1:-1].float()  # (T, V)
        if min_tokens:
            logits[:min_tokens, eos] = float("-inf")
        lp = torch.log_softmax(logits / (temperature or 1.0), -1)  # (T, V)
        if temperature and top_p < 1:
            probs, order = lp.exp().sort(dim=-1, descending=True, stable=True)  # (T, V)
            keep_sorted = probs.cumsum(-1) - probs < top_p  # nucleus: preceding mass < top_p
            keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)  # (T, V) in vocab order
            lp = lp - torch.log((probs * keep_sorted).sum(-1, keepdim=True))
            lp = lp.masked_fill(~keep, float("-inf"))
        return lp.gather(-1, torch.tensor(response_ids)[:, None])[:, 0]  # (T,)

    @classmethod
    def max_logprob_gap(cls, policy, g, temperature: float, min_tokens: int = 0, top_p: float = 1.0,
                        model=None) -> float:
        """Largest |recorded - teacher-forced| log-prob over every sampled token of ``g`` (teacher-forced
        by ``model``, default the policy's own)."""
        eos, model = policy.tokenizer.eos_token_id, model if model is not None else policy.model
        gaps = [(lp - cls.teacher_forced(model, p, r, temperature, min_tokens, eos, top_p)).abs().max().item()
                for p, r, lp in zip(g.prompt_ids, g.response_ids, g.logprobs, strict=True) if len(r)]
        return max(gaps)

    @staticmethod
    def assert_same(a, b, tol: float) -> None:
        """Two generations are the same samples (only for two runs of the same kernels)."""
        assert a.response_ids == b.response_ids and a.finish_reason == b.finish_reason
        assert a.response_text == b.response_text
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            torch.testing.assert_close(x, y, atol=tol, rtol=0)

    @staticmethod
    def assert_greedy_is_hf_generate(model, tok, g, max_tokens: int, tol: float) -> None:
        """Greedy samples ``g`` (``min_tokens == max_tokens``: EOS never allowed) of an HF model against
        HF ``generate`` on the same left-padded prompts: the same rows up to one (the two run other
        kernels, which may break an exact near-tie the other way), and at every position each side's
        token has the largest logit up to ``tol``."""
        import warnings

        from rlpipe.lm.sampler import _left_pad

        ids, mask, _ = _left_pad(g.prompt_ids, tok.pad_token_id, "cpu")
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model.generate(input_ids=ids, attention_mask=mask.long(), do_sample=False,
                                 max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        hf_ids = out[:, ids.shape[1]:].tolist()
        for prompt, ours, theirs in zip(g.prompt_ids, g.response_ids, hf_ids, strict=True):
            for resp in (ours, theirs):
                with torch.no_grad():
                    logits = model(torch.tensor(prompt + resp)[None]).logits[0, len(prompt) - 1:-1].float()  # (T, V)
                logits[:, tok.eos_token_id] = float("-inf")
                chosen = logits.gather(-1, torch.tensor(resp)[:, None])[:, 0]  # (T,)
                assert (logits.max(-1).values - chosen).max().item() <= tol
        assert sum(a == b for a, b in zip(g.response_ids, hf_ids, strict=True)) >= len(hf_ids) - 1  # not vacuous

    @staticmethod
    def assert_well_formed(policy, g, params: SamplingParams) -> None:
        """Each row's finish reason fits its tokens: EOS last for "eos", ``max_tokens`` for "length", a
        stop string in the decoded tokens for "stop"; no EOS before ``min_tokens``."""
        eos = policy.tokenizer.eos_token_id
        for ids, reason in zip(g.response_ids, g.finish_reason, strict=True):
            assert eos not in ids[:-1] and eos not in ids[:params.min_tokens]
            if reason == "eos":
                assert ids[-1] == eos
            elif reason == "length":
                assert len(ids) == params.max_tokens and ids[-1] != eos
            else:
                assert reason == "stop" and any(s in policy.tokenizer.decode(ids) for s in params.stop)

    @classmethod
    def against_eager(cls, policy, decode: str, tol: float, **kw) -> float:
        """``decode`` samples the eager model's distribution: its recorded log-probs equal the eager
        forward's teacher-forced log-probs of its own tokens within ``tol``; its rows are well formed;
        and a second call of the same decode gives the same samples exactly. Returns the largest gap."""
        g = cls.sample(policy, decode, **kw)
        params = SamplingParams(temperature=cls.TEMPERATURE, max_tokens=12, seed=7,
                                **{k: v for k, v in kw.items() if k != "prompts"})
        cls.assert_well_formed(policy, g, params)
        assert sum(len(r) for r in g.response_ids) > len(g.response_ids)  # something was sampled
        gap = cls.max_logprob_gap(policy, g, cls.TEMPERATURE, params.min_tokens)
        assert gap <= tol, f"decode={decode}: recorded log-probs differ from teacher forcing by {gap:.3g} > {tol}"
        cls.assert_same(cls.sample(policy, decode, **kw), g, 0.0)
        return gap


def check_bench_peaks(where: str, res: dict) -> None:
    """A bench JSON carries both fractions of the chip (``rlpipe.contract.BENCH_PEAK_KEYS``):
    positive and finite, or both None when the bench was skipped, and a ``peak_note`` naming them;
    a scaling JSON's every point has its own pair."""
    import math

    from rlpipe.contract import BENCH_PEAK_KEYS

    skipped = res.get("skipped") is True

    def pair(at: str, d: dict) -> None:
        for key in BENCH_PEAK_KEYS[:2]:
            assert key in d, f"{at}: no {key}"
            v = d[key]
            if skipped:
                assert v is None, f"{at}: {key} = {v!r} although nothing was measured"
            else:
                assert isinstance(v, float) and math.isfinite(v) and v > 0, f"{at}: {key} = {v!r}"

    pair(where, res)
    note = res.get(BENCH_PEAK_KEYS[2])
    assert isinstance(note, str) and note, f"{where}: no peak_note"
    if not skipped:  # the note says which fraction is which
        assert all(k in note for k in BENCH_PEAK_KEYS[:2]), note
    for i, p in enumerate(res.get("points", [])):
        pair(f"{where} point {i}", p)


@pytest.fixture(scope="session")
def bench_peaks():
    """``check_bench_peaks(where, bench_json)``: both peak fractions and the note (see there)."""
    return check_bench_peaks


@pytest.fixture(scope="session")
def decode_check() -> type[DecodeCheck]:
    return DecodeCheck


@pytest.fixture(scope="session", autouse=True)
def decode_cache(tmp_path_factory):
    """One AOT decode-package cache for the session (``rlpipe.lm.decode_package``), never the user's
    ``~/.cache``; autouse, so it is set before ``ray_session`` starts Ray and its workers inherit it."""
    from rlpipe.lm.decode_package import CACHE_ENV

    d = shared_dir(tmp_path_factory, "decode_cache")  # one per run: the workers build each package once
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(d))
        yield d


@pytest.fixture(scope="session", autouse=True)
def digest_cache(tmp_path_factory):
    """One cache of the run fingerprint's file digests for the session (``rlpipe.trainer.digest_cache``),
    never the user's ``~/.cache``; autouse, so every ``rlpipe train`` a test starts inherits it."""
    from rlpipe.trainer.digest_cache import CACHE_ENV

    d = tmp_path_factory.mktemp("digest_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(d))
        yield d


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for every trainer test in the session (saves ~5 s per run)."""
    import os

    import ray

    os.environ.setdefault("RAY_worker_niceness", "0")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
                 configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture
def no_ray(monkeypatch):
    """Fails the test if the command gets past its input checks: no ``ray.init`` and no driver
    (Ray may already be up from other tests)."""
    import ray

    from rlpipe.trainer import run as run_module

    was_up = ray.is_initialized()
    started = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append("ray.init"))
    monkeypatch.setattr(run_module, "_run_with_ray", lambda *a, **k: started.append("driver"))
    yield
    assert not started, f"got past the input checks: {started}"
    assert was_up or not ray.is_initialized()


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory):
    """(checkpoint, dataset dir) of a briefly trained micro TransformerLM, shared by trainer tests: built
    once per run (``build_once``: files in both xdist workers read it; the same bits either way) and
    kept for the README command's second session (the learning tests on other kernels). Read only."""
    def build(d: Path) -> None:
        _make_base(d)
        _make_dataset(d / "data")

    d = build_once(tmp_path_factory, "tiny_base", build, across_sessions=())  # the learning pass reuses it
    return str(d / "base.pt"), str(d / "data")


@pytest.fixture(scope="session")
def flip_tensor_bytes():
    return _flip_tensor_bytes


def _flip_tensor_bytes(path, n: int = 400) -> str:
    """Invert ``n`` bytes inside the largest tensor storage of the torch zip at ``path`` (stored
    uncompressed: its data starts after the entry's local header); returns the entry's name."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    assert info.compress_type == zipfile.ZIP_STORED and info.file_size >= 2 * n
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        start = info.header_offset + 30 + name_len + extra_len + info.file_size // 2 - n // 2
        f.seek(start)
        data = f.read(n)
        f.seek(start)
        f.write(bytes(b ^ 0x01 for b in data))  # low bits: the values stay finite
    return info.filename


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: one intra-op thread is as fast and does not spin against other jobs on a
    shared 2-core machine. Restored after the module (opt in with ``pytest.mark.usefixtures``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def write_config():
    """``write_config(path, train=None, variants=None, **sections) -> path``: a trainer config with
    tiny sizes (``BASE_TRAIN``) and the test variants (``VARIANTS``)."""
    return _write_config


@pytest.fixture(scope="session")
def make_base():
    """``make_base(dir, pretrain_steps=300, **model_overrides) -> (checkpoint, tokenizer)``."""
    return _make_base


@pytest.fixture(scope="session")
def make_dataset():
    """``make_dataset(dir) -> dir``: a 9-train / 6-val keyword dataset."""
    return _make_dataset


# --------------------------------------------------------------------------- learning tests


def _learning_seed() -> int:
    return int(os.environ.get("RLPIPE_LEARNING_SEED", "0"))


class Learning:
    """What a learning test needs to have its noise measured (``tests/learning_noise.py``).

    ``seed`` is added to the test's own seeds: 0 (the default) runs the test as written; the noise
    harness sets ``RLPIPE_LEARNING_SEED`` to 1, 2, ... to rerun it on other seeds.
    ``check(name, value, threshold, noise)`` appends one JSON row to ``$RLPIPE_LEARNING_LOG`` when that
    is set (the harness's record; nothing is written otherwise), then asserts ``value > threshold``.
    ``noise`` is the standard deviation of ``value`` measured over seeds and CPU kernels, written next
    to the threshold in the test; the harness compares it with what it measures now.
    """

    def __init__(self, nodeid: str):
        self.nodeid = nodeid
        self.seed = _learning_seed()

    def check(self, name: str, value: float, threshold: float, noise: float) -> None:
        log = os.environ.get("RLPIPE_LEARNING_LOG")
        if log:
            row = {"test": self.nodeid, "name": name, "seed": self.seed, "value": float(value),
                   "threshold": threshold, "stated_noise": noise,
                   "capability": torch.backends.cpu.get_cpu_capability(),
                   "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", "")}
            with open(log, "a") as f:
                f.write(json.dumps(row) + "\n")
        assert noise is not None and noise > 0, f"{self.nodeid}: state the measured noise sd of {name!r}"
        assert value > threshold, f"{name} = {value:.4f}, want > {threshold} (noise sd {noise})"


@pytest.fixture
def learning(request) -> Learning:
    """The seed offset and recorder of a learning test (``Learning``)."""
    return Learning(request.node.nodeid)


@pytest.fixture(scope="session")
def learning_seed() -> int:
    """The seed offset of the learning tests, for their module-scoped fixtures (``Learning.seed``)."""
    return _learning_seed()


# --------------------------------------------------------------------------- synthetic runs

SPECS = {
    # variant: (mode, devices, wall, per-step {phase: seconds}, sync seconds per step, k)
    "onpolicy": ("colocated_sync", 1, 40.0, {"generate": 6.0, "update": 2.0}, [0.5, 0.4, 0.6, 0.5], 1),
    "k2": ("colocated_k", 1, 32.0, {"generate": 5.0, "update": 2.0}, [0.5, math.nan, 0.5, math.nan], 2),
    "disagg": ("disaggregated", 2, 25.0, {"generate": 5.0, "update": 3.0, "ref_logprobs": 1.0},
               [0.25, 0.25, 0.25, 0.25], 1),
}
VAL = {0: 0.1, 2: 0.5, 4: 0.4}


def _metrics(variant: str, wall: float, phases: dict, sync: list[float]) -> pd.DataFrame:
    rows = []
    for step in range(5):
        row = {c: math.nan for c in contract.METRIC_COLUMNS}
        row.update(step=step, policy_version=step, wall_time=wall * step / 4, samples=8 * step)
        row["reward/val_mean"] = VAL.get(step, math.nan)
        if step:
            row.update({"kl/ref_log_ratio": 0.01 * step**2, "kl/ref_k3": 0.008 * step**2,
                        "kl/prev_log_ratio": 0.001 * step, "kl/prev_k3": 0.0008 * step,
                        "sync/seconds": sync[step - 1], "sync/bytes": 1e6, "sync/gbps": 1e6 / 1e9 / 0.5,
                        "response/length_mean": 20.0, "reward/train_mean": 0.1 * step,
                        **{f"time/{p}": s for p, s in phases.items()}})
            if variant == "disagg":
                row.update({"staleness/max": 1.0, "staleness/mean": 1.0})
        rows.append(row)
    df = pd.DataFrame(rows, columns=list(contract.METRIC_COLUMNS))
    return df.astype({c: "int64" for c in contract.METRIC_INT_COLUMNS})


def _events(mode: str, phases: dict, sync: list[float]) -> pd.DataFrame:
    # step 0: initial validation before the clock starts (negative times); excluded from totals
    rows, t = [("validate", "generator", -3.0, -1.0, 0, 0)], 0.0
    for step in range(1, 5):
        for phase, sec in phases.items():
            actor = "worker" if mode != "disaggregated" else ("generator" if phase == "generate" else "learner")
            rows.append((phase, actor, t, t + sec, step, step - 1))
            if mode != "disaggregated":
                t += sec
        if not math.isnan(sync[step - 1]):
            rows.append(("weight_sync", "learner", t, t + sync[step - 1], step, step))
            t += sync[step - 1]
        if mode == "colocated_sync":
            rows.append(("wait", "driver", 0.0, phases["generate"], step, step - 1))
        if step in (2, 4):
            rows.append(("validate", "generator", t, t + 1.0, step, step))
        if mode == "disaggregated":
            t += 5.0
    df = pd.DataFrame(rows, columns=list(contract.EVENT_COLUMNS))
    return df.astype({c: "int64" for c in contract.EVENT_INT_COLUMNS})


def _make_runs(root: Path, variants=("onpolicy", "k2", "disagg"), device_type: str = contract.DEVICE_CPU,
               conditions: dict[str, dict] | None = None) -> Path:
    """Write synthetic results/runs/<variant>/ directories following ``rlpipe.contract``;
    ``conditions[variant]``, when given, is that run's run_info ``conditions`` (else it has none,
    like a run from before they were recorded)."""
    for v in variants:
        mode, devices, wall, phases, sync, k = SPECS[v]
        d = root / v
        d.mkdir(parents=True, exist_ok=True)
        _metrics(v, wall, phases, sync).to_parquet(d / contract.METRICS_FILE, index=False)
        _events(mode, phases, sync).to_parquet(d / contract.EVENTS_FILE, index=False)
        versions = pd.DataFrame(
            [("learner", s, 5.0 * s, "optimizer_step") for s in range(1, 5)]
            + [("generator", 0, 0.0, "init")] + [("generator", s, 5.0 * s + 0.1, "load_weights") for s in range(1, 4)],
            columns=list(contract.VERSION_COLUMNS)).astype({c: "int64" for c in contract.VERSION_INT_COLUMNS})
        versions.to_parquet(d / contract.VERSIONS_FILE, index=False)
        with open(d / contract.ROLLOUTS_FILE, "w") as f:
            for step, reward in ((1, 0.0), (1, 1.0), (4, 1.0), (4, 1.0)):
                f.write(json.dumps({"step": step, "version": step, "prompt": "Write a story with: cat",
                                    "response": "the cat sat" if reward else "a dog", "reward": reward,
                                    "ground_truth": ["cat"]}) + "\n")
        info = {"variant": v, "mode": mode, "devices": devices, "device_type": device_type, "threads": 2,
                "wall_time_s": wall, "total_samples": 32, "total_optimizer_steps": 4, "k": k,
                "transport": "object_store" if mode == "disaggregated" else "local", "backend": None,
                "finished": True}
        if conditions and v in conditions:
            info["conditions"] = conditions[v]
        (d / contract.RUN_INFO_FILE).write_text(json.dumps(info))
    return root


@pytest.fixture(scope="session")
def make_runs():
    """``make_runs(root, variants=("onpolicy", "k2", "disagg"), device_type="cpu", conditions=None) -> root``."""
    return _make_runs


# --------------------------------------------------------------------------- snakemake dry runs


class DryRun:
    """Parsers for a ``snakemake -n`` printout."""

    @staticmethod
    def jobs(output: str) -> list[dict]:
        """Planned jobs (``all`` excluded): rule, wildcards, resources, threads and input files of each,
        and its shell command (with ``-p``; else ""); ``[]`` when nothing is to be done. A group's jobs
        (the analysis group: workflow/rules/common.smk) are listed indented under "Group job ...", each
        with its own shell command."""
        out = []
        for block in re.split(r"\n(?=[ \t]*(?:localrule|rule) \w+:)", output):
            m = re.match(r"[ \t]*(?:localrule|rule) (\w+):", block)
            if not m or m.group(1) == "all":
                continue
            job = {"rule": m.group(1)}
            for key in ("wildcards", "resources"):
                line = re.search(rf"^\s+{key}: (.*)$", block, re.M)
                job[key] = dict(kv.split("=", 1) for kv in line.group(1).split(", ")) if line else {}
            threads = re.search(r"^\s+threads: (\d+)$", block, re.M)
            job["threads"] = int(threads.group(1)) if threads else 1  # Snakemake omits threads: 1
            inputs = re.search(r"^\s+input: (.*)$", block, re.M)
            job["input"] = inputs.group(1).split(", ") if inputs else []
            shell = re.search(r"^Shell command: (.*)$", block, re.M)  # with -p (--printshellcmds)
            job["shell"] = shell.group(1).strip() if shell and shell.group(1).strip() != "None" else ""
            out.append(job)
        return out

    @classmethod
    def rules(cls, output: str) -> set[str]:
        return {j["rule"] for j in cls.jobs(output)}

    @classmethod
    def training_gpus(cls, output: str) -> dict[str, int]:
        """GPUs per planned training run, keyed by the track directory + variant ('k2', 'math/onpolicy')."""
        return {j["wildcards"].get("tdir", "") + j["wildcards"]["variant"]: int(j["resources"]["gpu"])
                for j in cls.jobs(output) if j["rule"] == "train_variant"}


@pytest.fixture(scope="session")
def dry_run():
    return DryRun


#: The dry-run server (``DryRuns``): it imports Snakemake and what the Snakefile imports once, and scans
#: the imports of rlpipe's modules for the reports' code inputs once (rlpipe.workflow.code_inputs caches
#: them; the source does not change during a run), then forks
#: a child per request that runs Snakemake's command line (``snakemake.cli.main``) in the request's
#: directory, with its stdout and stderr in files, and answers with its exit status. The fork keeps each
#: run as separate as a process of its own (no state of one workflow reaches the next).
_DRY_RUN_SERVER = r"""
import json, os, signal, sys, traceback
import snakemake.cli
import pandas, rlpipe.config, rlpipe.trainer.conditions, rlpipe.workflow.loading
from rlpipe.cli import COMMANDS
from rlpipe.workflow.code_inputs import code_inputs
code_inputs(COMMANDS, *COMMANDS)  # the import scan of rlpipe's modules (cached) once, for every fork
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(req["timeout"])
            os.environ.clear()
            os.environ.update(req["env"])  # the asking test's environment (its monkeypatched variables)
            os.chdir(req["cwd"])
            for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            snakemake.cli.main(req["args"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""
DRY_RUN_FLAGS = ("-n", "--dry-run", "--dryrun")


class DryRuns:
    """``snakemake -n`` without a Python start and Snakemake's import each time: a dry run costs about
    half the CPU of a ``python -m snakemake`` process, most of which is imports (``_DRY_RUN_SERVER``).
    One server per pytest process, started at its first dry run and ended with the process. A run gets
    the asking process's environment variables; one whose ``PYTHONPATH`` differs from the server's
    (modules it imports from elsewhere) is not a dry run for the server (``serves``)."""

    _server: subprocess.Popen | None = None
    _pythonpath: str | None = None

    @classmethod
    def serves(cls, env: dict | None = None) -> bool:
        """Whether a dry run in ``env`` (default: this process's) can go through the server."""
        env = os.environ if env is None else env
        return cls._server is None or env.get("PYTHONPATH") == cls._pythonpath

    @classmethod
    def run(cls, cmd: list[str], cwd: Path, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
        import atexit
        import tempfile

        if cls._server is None or cls._server.poll() is not None:
            cls._server = subprocess.Popen([sys.executable, "-c", _DRY_RUN_SERVER], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True, cwd=ROOT)
            cls._pythonpath = os.environ.get("PYTHONPATH")
            atexit.register(cls._server.stdin.close)  # the server's loop ends at EOF
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"args": cmd[3:], "cwd": str(cwd), "stdout": str(out), "stderr": str(err), "timeout": timeout,
                       "env": dict(os.environ if env is None else env)}
            cls._server.stdin.write(json.dumps(request) + "\n")
            cls._server.stdin.flush()
            answer = cls._server.stdout.readline()
            if not answer:
                raise RuntimeError(f"the dry-run server ended (exit {cls._server.wait()}) running {' '.join(cmd)}")
            rc = json.loads(answer)["rc"]
            return subprocess.CompletedProcess(cmd, rc, out.read_text(), err.read_text())


def _run_snakemake(workdir: Path, *args: str, check: bool = True, env: dict | None = None,
                   timeout: int = 600) -> subprocess.CompletedProcess:
    """The project's Snakefile in ``workdir``; a dry run goes through ``DryRuns`` (in ``env``, default
    this process's environment), anything else (a real run, another ``PYTHONPATH``) is a
    ``python -m snakemake`` process."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir), *args]
    if set(args) & set(DRY_RUN_FLAGS) and DryRuns.serves(env):
        proc = DryRuns.run(cmd, workdir, timeout, env)
    else:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=workdir, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="session")
def run_snakemake():
    """``run_snakemake(workdir, *args, check=True, env=None, timeout=600)`` (``_run_snakemake``)."""
    return _run_snakemake


# --------------------------------------------------------------------------- built once per run


def shared_dir(tmp_path_factory, name: str) -> Path:
    """A directory every pytest-xdist worker of this run shares (the parent of the workers' base
    temporary directories; without xdist, this session's), created if missing."""
    base = tmp_path_factory.getbasetemp()
    d = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    d.mkdir(parents=True, exist_ok=True)
    return d


#: Where ``build_once(..., across_sessions=...)`` keeps what it built for the next pytest session: the
#: README's test command runs two (the suite, then the learning tests on other CPU kernels), and both
#: pretrain the same micro models. Keyed by everything a build reads (``_build_key``), so a change to
#: any of it builds afresh; entries of another key are removed after ``STALE_BUILD_S``.
SESSION_BUILDS = Path(os.environ.get("RLPIPE_TEST_BUILDS",
                                    Path(tempfile.gettempdir()) / f"rlpipe-test-builds-{os.getuid()}"))
STALE_BUILD_S = 3600


def _build_key(name: str, parts: tuple) -> str:
    """A digest of what a build reads: rlpipe's source, this file (the builders), the test files, the
    Python, torch and tokenizers versions and ``parts`` (a test's own settings, its learning seed). Not
    the CPU kernels: the second session is the learning pass on other kernels, which shares the base."""
    import tokenizers

    h = hashlib.sha256(repr((name, parts, torch.__version__, tokenizers.__version__, sys.version)).encode())
    for f in sorted([*(ROOT / "src" / "rlpipe").rglob("*.py"), *(ROOT / "tests").glob("*.py")]):
        h.update(f.relative_to(ROOT).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _session_build_dir(name: str, parts: tuple) -> Path:
    """``SESSION_BUILDS/<name>-<key>``, created; other keys' entries of ``name`` older than
    ``STALE_BUILD_S`` are removed (a fresh clone's CI builds once, then its second session reuses it)."""
    key = _build_key(name, parts)
    SESSION_BUILDS.mkdir(parents=True, exist_ok=True)
    for old in SESSION_BUILDS.glob(f"{name}-*"):
        if old.is_dir() and old.name != f"{name}-{key}" and time.time() - old.stat().st_mtime > STALE_BUILD_S:
            shutil.rmtree(old, ignore_errors=True)
            old.with_name(f"{old.name}.lock").unlink(missing_ok=True)  # its lock file (build_once) with it
    d = SESSION_BUILDS / f"{name}-{key}"
    d.mkdir(exist_ok=True)
    os.utime(d)  # in use: not stale
    return d


def build_once(tmp_path_factory, name: str, build, across_sessions: tuple | None = None) -> Path:
    """``shared_dir(name)`` after ``build(directory)`` ran in it once per run, in whichever worker asks
    first; the others wait on its lock and reuse what it wrote. A failed build is not retried by the
    next asker (it would fail the same way, minutes later): it raises with the first one's error.
    With ``across_sessions`` (a tuple of the build's own settings), the directory is
    ``_session_build_dir``: the next pytest session with the same code and settings reuses it too
    (a failed build is retried there)."""
    run = str(shared_dir(tmp_path_factory, ".").resolve())  # this run's directory: names a failure's run
    d = shared_dir(tmp_path_factory, name) if across_sessions is None else _session_build_dir(name, across_sessions)
    done, failed = d / ".built", d / ".failed"
    with open(d.parent / f"{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if failed.exists():
            who, _, error = failed.read_text().partition("\n")
            if who == run:
                raise RuntimeError(f"{name} failed to build in another worker of this run:\n{error}")
            shutil.rmtree(d)  # an earlier session's failed build: built afresh
            d.mkdir()
        if not done.exists():
            try:
                build(d)
            except BaseException as e:
                failed.write_text(f"{run}\n" + f"{type(e).__name__}: {e}"[-6000:])
                raise
            done.touch()
    return d


@pytest.fixture(scope="session")
def built_once(tmp_path_factory):
    """``built_once(name, build, across_sessions=None)``: ``build_once`` for a test module's own builds."""
    return lambda name, build, across_sessions=None: build_once(tmp_path_factory, name, build, across_sessions)


#: The suite's one smoke workflow run: config/smoke.yaml over the default config with the worked
#: example's overlay (a user's track, examples/wordrev) and ``SMOKE_TRACKS``, which runs the built-in
#: tracks and the example's side by side: the tests of the smoke run, of the example and of SLURM read
#: one run. Where the test SLURM cluster is up (CI brings it up before the tests start) the run goes through it, every
#: job an sbatch job with the GPUs it declares (``SLURM_GPUS_FILE``: slurm_harness.GPUS), as a cluster user runs it.
SMOKE_CONFIGS = ("config/config.yaml", "config/smoke.yaml", "examples/wordrev/config.yaml",
                 "config/smoke_tracks.yaml")
SMOKE_TRACKS = {"workflow": {"tracks": ["keyword", "math", "wordrev"],
                             "families": ["epochs_per_batch", "systems", "wordrev_systems", "wordrev_lr"]}}
SLURM_GPUS_FILE = "config/slurm_gpus.yaml"


class SmokeRun:
    """A working directory holding copies of config/ and examples/wordrev/, where the workflow ran on
    ``configfiles`` (``results/``, ``report.html``). Through SLURM: ``slurm_jobs`` (every job's last
    record) and ``output`` (Snakemake's), else None."""

    def __init__(self, workdir: Path):
        self.workdir, self.results = workdir, workdir / "results"
        jobs = workdir / "slurm_jobs.json"
        self.slurm_jobs = json.loads(jobs.read_text()) if jobs.exists() else None
        self.configfiles = SMOKE_CONFIGS + ((SLURM_GPUS_FILE,) if self.slurm_jobs is not None else ())
        self.output = (workdir / "snakemake.out").read_text() if self.slurm_jobs is not None else None

    def snakemake(self, *args: str, configfiles=None, timeout: int = 1800) -> subprocess.CompletedProcess:
        """``snakemake ARGS --configfile CONFIGFILES`` (default: the run's) here, on this machine; a
        failure raises with every job log's tail. The venv's bin/ leads PATH, as for a user who
        activated it (the jobs' ``rlpipe``, ``python``)."""
        env = activated_env()
        cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(self.workdir),
               *args, "--configfile", *(configfiles or self.configfiles)]
        if set(args) & set(DRY_RUN_FLAGS) and DryRuns.serves():  # no job runs: no PATH needed
            proc = DryRuns.run(cmd, self.workdir, timeout)
        else:
            proc = subprocess.run(cmd, cwd=self.workdir, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}\n{self.job_logs()}")
        return proc

    def job_logs(self) -> str:
        return "\n".join(f"== {p}\n{p.read_text()[-1500:]}" for p in sorted((self.workdir / "logs").rglob("*.log")))


def build_smoke(workdir: Path, through_slurm: bool) -> None:
    """The smoke workflow run (its default target) and its report in ``workdir``: on this machine, or
    through SLURM's workflow profile with GPUs declared (every job's SLURM record kept in
    slurm_jobs.json; nothing of the run left running)."""
    import slurm_harness as sh

    shutil.copytree(ROOT / "config", workdir / "config")
    shutil.copytree(ROOT / "examples" / "wordrev", workdir / "examples" / "wordrev")
    (workdir / SMOKE_CONFIGS[-1]).write_text(yaml.safe_dump(SMOKE_TRACKS, sort_keys=False))
    if through_slurm:
        (workdir / SLURM_GPUS_FILE).write_text(yaml.safe_dump(sh.GPUS))
        proc = sh.start(workdir, overlays=(*SMOKE_CONFIGS, SLURM_GPUS_FILE),
                        extra=("--resources", f"gpu={sh.SLURM_GPU_POOL}"))
        try:
            rc, out, jobs = sh.finish_recording_jobs(proc, workdir, timeout=1800)
        finally:
            sh.assert_none_outlives(workdir)
        if rc != 0:
            raise AssertionError(f"the smoke run through SLURM failed (exit {rc}):\n{out[-4000:]}\n"
                                 f"{SmokeRun(workdir).job_logs()}")
        (workdir / "slurm_jobs.json").write_text(json.dumps(jobs))
    else:
        SmokeRun(workdir).snakemake("--cores", "2")
    SmokeRun(workdir).snakemake("--report", "report.html", timeout=600)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> SmokeRun:
    """The smoke workflow run (``SMOKE_CONFIGS``) and its report, made once per run (``build_once``),
    through SLURM where its test cluster answers (CI brings it up while pip installs); tests read it and
    may dry-run against it, never change its results."""
    from slurm_harness import answers

    return SmokeRun(build_once(tmp_path_factory, "smoke_run", lambda d: build_smoke(d, answers())))


@pytest.fixture(scope="module")
def cluster():
    """The test SLURM cluster (tests/slurm_harness.py), brought up or found up; stopped afterwards only
    if this fixture started it. Where it cannot be brought up (not root, no apt-get) a test skips with
    the script's one line, and fails instead when CI=true."""
    from slurm_harness import Cluster

    c = Cluster()
    if not c.available:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the SLURM tests: {c.reason}")
        pytest.skip(c.reason)
    yield c
    c.down()


@pytest.fixture(scope="module")
def slurm_smoke(cluster, smoke_run, tmp_path_factory) -> SmokeRun:
    """The whole smoke workflow (its default target: every job) through the SLURM profile with GPUs
    declared: the suite's smoke run where it went through SLURM (CI), else one made here."""
    if smoke_run.slurm_jobs is not None:
        return smoke_run
    return SmokeRun(build_once(tmp_path_factory, "slurm_smoke_run", lambda d: build_smoke(d, True)))


# --------------------------------------------------------------------------- processes


def _live_processes(procs) -> list:
    import psutil

    out = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


@pytest.fixture(scope="session")
def live_processes():
    return _live_processes


# --------------------------------------------------------------------------- tiny HF Qwen2


def _math_documents() -> list[tuple[str, str]]:
    """(r1_zero prompt, completion with the right answer) for every MATH fixture problem."""
    from rlpipe.tasks.math.task import MathTask

    task = MathTask(MATH_FIXTURE)
    return [(e.prompt, f" I compute it. </think> <answer> {e.ground_truth} </answer>")
            for e in task.train_examples() + task.val_examples()]


def _make_tiny_qwen(d: Path, train_steps: int = 100) -> Path:
    """A 2-layer Qwen2 (hidden 64, 4 heads, 2 KV heads, tied embeddings) with a BPE trained here on
    the fixture's prompts, saved with ``save_pretrained`` + tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Config, Qwen2ForCausalLM

    docs = _math_documents()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([p + c for p, c in docs] * 4, trainer=trainer)
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}))
    eos = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos))
    seqs = [tok.encode(p + c).ids + [eos] for p, c in docs]
    width = max(map(len, seqs))
    ids = torch.tensor([s + [eos] * (width - len(s)) for s in seqs])  # (N, L)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only contend on a shared machine
    try:
        for _ in range(train_steps):
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory) -> Path:
    """Directory of a tiny HF Qwen2 policy for the MATH fixture (see ``_make_tiny_qwen``), built once per
    run (``build_once``: files in both xdist workers read it); tests copy it before changing anything."""
    return build_once(tmp_path_factory, "tiny_qwen", lambda d: _make_tiny_qwen(d / "qwen")) / "qwen"


def _make_random_hf(d: Path, tokenizer_dir: Path, arch: str) -> Path:
    """A 2-layer causal LM of another architecture (``gpt2`` or ``gpt_neox``) with random weights,
    built from its config and saved with ``tokenizer_dir``'s tokenizer: any architecture
    transformers loads must work as a policy, not only Llama and Qwen2."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM

    d.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, d / name)
    vocab = len(json.loads((d / "tokenizer.json").read_text())["model"]["vocab"])
    eos = json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]["<|endoftext|>"]
    ids = dict(vocab_size=vocab, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(0)
    if arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512, **ids))
    elif arch == "gpt_neox":
        model = GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                 intermediate_size=128, max_position_embeddings=512, **ids))
    else:
        raise ValueError(arch)
    model.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def random_hf(tmp_path_factory, tiny_qwen):
    """``random_hf(arch)``: the directory of a random-weight ``gpt2`` or ``gpt_neox`` policy."""
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = _make_random_hf(tmp_path_factory.mktemp(arch) / arch, Path(tiny_qwen), arch)
        return made[arch]
    return get


@pytest.fixture(scope="session")
def math_fixture() -> Path:
    """The handwritten MATH-format dataset directory (train.jsonl + validation.jsonl)."""
    return MATH_FIXTURE
