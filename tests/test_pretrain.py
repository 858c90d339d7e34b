"""rlpipe.lm.pretrain: schedule, batching, a tiny learning run, checkpoint, zero-shot reward, errors."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from rlpipe.config import ConfigError, DataConfig, ModelSection, PipelineConfig, PretrainConfig
from rlpipe.lm.pretrain import (
    compute_dtype,
    lm_loss,
    log_path,
    lr_at,
    main,
    pretrain,
    sample_windows,
)
from rlpipe.lm.tokenizer import train_tokenizer_main
from rlpipe.tasks.keyword.corpus import build_corpus
from rlpipe.tasks.keyword.eval import zero_shot_reward

MICRO = {"num_layers": 1, "d_model": 32, "num_heads": 2, "d_ff": 64, "context_length": 64}


def _cfg(**pre) -> PipelineConfig:
    base = {"max_steps": 30, "batch_size": 8, "seq_len": 32, "warmup_steps": 3, "eval_every": 10,
            "learning_rate": 1e-2, "val_fraction": 0.05, "threads": 1, "device": "cpu"}
    base.update(pre)
    return PipelineConfig(data=DataConfig(num_stories=300, num_prompts=40),
                          model=ModelSection(overrides=dict(MICRO)), pretrain=PretrainConfig(**base))


def test_lr_schedule_hand_values():
    p = PretrainConfig(max_steps=110, warmup_steps=10, learning_rate=1.0, min_lr_ratio=0.1)
    assert lr_at(0, p) == pytest.approx(0.1)  # (0 + 1) / 10
    assert lr_at(9, p) == pytest.approx(1.0)
    assert lr_at(10, p) == pytest.approx(1.0)  # cosine starts at the peak
    assert lr_at(60, p) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))  # halfway: 0.55
    assert lr_at(110, p) == pytest.approx(0.1)
    assert lr_at(0, PretrainConfig(warmup_steps=0, learning_rate=2.0, max_steps=5)) == pytest.approx(2.0)


def test_sample_windows_shift_by_one():
    stream = torch.arange(100)
    x, y = sample_windows(stream, 4, 10, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 10)
    assert torch.equal(y, x + 1)  # consecutive tokens, targets one ahead
    assert int(x.max()) < 100 and int(y.max()) <= 99


def test_pack_corpus_offsets_and_doc_aligned_windows(tmp_path):
    from rlpipe.lm.pretrain import pack_corpus

    class CharTok:  # one token per character, EOS = 0
        eos_token_id = 0

        def encode_batch(self, texts):
            return [[ord(c) for c in t] for t in texts]

    docs = ["abc", "defgh", "ij", "klmnop", "qrs"] * 20
    (tmp_path / "c.txt").write_text("\n<|endoftext|>\n".join(docs))
    s = pack_corpus(tmp_path / "c.txt", CharTok(), val_fraction=0.3, seq_len=4, seed=0)
    assert s.documents == 100
    assert s.train.numel() + s.val.numel() == sum(len(d) + 1 for d in docs)
    for stream, starts in ((s.train, s.train_starts), (s.val, s.val_starts)):
        assert starts.numel() > 0 and int(starts[0]) == 0
        # Every start follows an EOS (or is 0) and leaves room for a full window.
        assert all(int(o) == 0 or int(stream[o - 1]) == 0 for o in starts)
        assert int(starts.max()) + 5 <= stream.numel()
    x, y = sample_windows(s.train, 32, 4, torch.Generator().manual_seed(0), s.train_starts)
    firsts = {chr(int(c)) for c in x[:, 0]}
    assert firsts <= {d[0] for d in docs}  # windows begin at a document's first token


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("pre")
    cfg = _cfg()
    build_corpus(cfg, d / "corpus.txt")
    (d / "c.yaml").write_text("tokenizer:\n  vocab_size: 400\n")
    assert train_tokenizer_main(["--config", str(d / "c.yaml"), "--corpus", str(d / "corpus.txt"),
                                 "--out", str(d / "tok.json")]) == 0
    res = pretrain(cfg, d / "corpus.txt", d / "tok.json", d / "model.pt", progress=False)
    return d, cfg, res


def test_tiny_pretraining_loss_decreases_and_checkpoint_loads(tiny_run):
    from rlpipe.lm.checkpoint import load_checkpoint

    d, _, res = tiny_run
    curve = res.log["curve"]
    assert len(curve) == 30 and res.steps == 30
    first = sum(r["train_loss"] for r in curve[:3]) / 3
    assert first > math.log(400) - 1.0  # starts near uniform over the vocabulary
    assert res.val_loss < first - 1.5, (first, res.val_loss)
    vals = [r["val_loss"] for r in curve if "val_loss" in r]
    assert len(vals) == 3 and vals[-1] < vals[0]
    ck = load_checkpoint(d / "model.pt")
    assert ck.tokenizer == str(d / "tok.json")
    assert ck.extra["steps"] == 30 and ck.extra["val_loss"] == pytest.approx(res.val_loss)
    assert ck.model_config.num_layers == 1 and ck.model_config.vocab_size <= 400
    log = json.loads(log_path(d / "model.pt").read_text())
    assert log["steps"] == 30 and len(log["curve"]) == 30 and log["wall_time_s"] > 0
    assert log["dtype"] == "float32"  # pretrain.dtype auto on CPU


@pytest.mark.parametrize("dtype, device, expected", [
    ("auto", "cpu", "float32"), ("auto", "cuda", "bfloat16"), ("auto", "cuda:1", "bfloat16"),
    ("float32", "cuda", "float32"), ("bfloat16", "cpu", "bfloat16"), ("float32", "cpu", "float32"),
])
def test_pretrain_dtype_auto_is_bf16_on_cuda_and_fp32_on_cpu(dtype, device, expected):
    """The whole decision table: the same config gives the same precision on every CPU (none of its
    bf16 units or kernel level enter), and an explicit dtype is kept."""
    assert compute_dtype(PretrainConfig(dtype=dtype), torch.device(device)) == expected


def test_lm_loss_autocasts_only_when_asked():
    """``lm_loss`` in float32 is the plain fp32 loss exactly; in bfloat16 its matmuls are bf16
    (another value, within bf16's rounding), so the dtype argument really reaches autocast."""
    from rlpipe.lm.model import ModelConfig, TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(ModelConfig.from_preset("cpu-tiny", vocab_size=64, **MICRO))
    x = torch.randint(0, 64, (2, 33))  # (B, T + 1)
    ref = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    fp32 = lm_loss(model, x[:, :-1], x[:, 1:], torch.device("cpu"), "float32")
    bf16 = lm_loss(model, x[:, :-1], x[:, 1:], torch.device("cpu"), "bfloat16")
    assert float(fp32) == float(ref)
    assert float(bf16) != float(ref) and abs(float(bf16) - float(ref)) < 0.05


def test_pretrain_precision_bench_times_both_precisions_side_by_side():
    from rlpipe.bench.pretrain_precision import run_bench

    r = run_bench("cpu-tiny", vocab=64, batch=2, seq_len=8, repeats=2, device="cpu")
    assert r["float32"]["steps"] == r["bfloat16"]["steps"] == 2
    assert r["bf16_over_fp32"] == pytest.approx(r["bfloat16"]["median_s"] / r["float32"]["median_s"], rel=0.01)
    assert set(r["cpu_bf16_flags"]) <= {"avx512_bf16", "amx_bf16"}


def test_pretraining_is_seeded(tiny_run, tmp_path):
    d, cfg, res = tiny_run
    cfg.pretrain.max_steps = 5
    a = pretrain(cfg, d / "corpus.txt", d / "tok.json", tmp_path / "a.pt", progress=False)
    b = pretrain(cfg, d / "corpus.txt", d / "tok.json", tmp_path / "b.pt", progress=False)
    assert [r["train_loss"] for r in a.log["curve"]] == [r["train_loss"] for r in b.log["curve"]]


def test_zero_shot_reward_runs_on_the_tiny_model(tiny_run, tmp_path):
    from rlpipe.tasks.keyword.dataset import build_dataset

    d, cfg, _ = tiny_run
    build_dataset(cfg, tmp_path / "ds")
    res = zero_shot_reward(d / "model.pt", tmp_path / "ds", n=6, temperature=0.8, max_tokens=8, seed=0)
    assert res.n == 6 and len(res.responses) == 6
    assert all(r in (0.0, 1.0) for r in res.rewards) and res.mean == sum(res.rewards) / 6
    again = zero_shot_reward(d / "model.pt", tmp_path / "ds", n=6, temperature=0.8, max_tokens=8, seed=0)
    assert again.responses == res.responses


def test_evaluate_base_reads_only_its_train_settings(tiny_run, tmp_path):
    """``rlpipe eval-base`` reads the train keys of ``eval_base_settings`` and no others, so the
    workflow's evaluate_base rule, whose params are those settings, reruns on nothing else: here it
    runs with a config whose train section holds only them."""
    from types import SimpleNamespace

    from rlpipe.config import EVAL_BASE_TRAIN_KEYS, TrainConfig, eval_base_settings
    from rlpipe.tasks.keyword.dataset import build_dataset
    from rlpipe.tasks.keyword.eval import evaluate_base

    d, cfg, _ = tiny_run
    build_dataset(cfg, tmp_path / "ds")
    only = SimpleNamespace(train=SimpleNamespace(sampling_temperature=0.8, sampling_max_tokens=8, val_seed=0))
    out = evaluate_base(only, d / "model.pt", tmp_path / "ds", 4)
    assert out["n"] == 4 and out["max_tokens"] == 8
    # other train keys leave the settings (the rule's params) alone; its own keys change them
    a = SimpleNamespace(train=TrainConfig())
    b = SimpleNamespace(train=TrainConfig(learning_rate=0.5, n_grpo_steps=3, mode="disaggregated"))
    assert eval_base_settings(a) == eval_base_settings(b) and set(eval_base_settings(a)) == set(EVAL_BASE_TRAIN_KEYS)
    assert eval_base_settings(a) != eval_base_settings(SimpleNamespace(train=TrainConfig(sampling_max_tokens=7)))


def test_cli_main_writes_checkpoint_and_log(tiny_run, tmp_path, capsys):
    d, _, _ = tiny_run
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model:\n  overrides: {num_layers: 1, d_model: 32, num_heads: 2, d_ff: 64, context_length: 64}\n"
                   "pretrain: {max_steps: 4, batch_size: 4, seq_len: 16, warmup_steps: 1, eval_every: 2, "
                   "threads: 1, device: cpu}\n")
    out = tmp_path / "base" / "model.pt"
    assert main(["--config", str(cfg), "--corpus", str(d / "corpus.txt"), "--tokenizer", str(d / "tok.json"),
                 "--out", str(out), "--no-progress"]) == 0
    assert out.is_file() and log_path(out).is_file()
    assert "4 steps" in capsys.readouterr().out


@pytest.mark.parametrize("pre, key", [
    ({"val_fraction": 1.5}, "pretrain.val_fraction"),
    ({"max_steps": 0}, "pretrain.max_steps"),
    ({"min_lr_ratio": 2.0}, "pretrain.min_lr_ratio"),
    ({"device": "tpu"}, "pretrain.device"),
    ({"seq_len": 128}, "pretrain.seq_len"),  # > the micro model's context_length 64
])
def test_bad_pretrain_config_fails_before_work(tiny_run, tmp_path, pre, key):
    d, _, _ = tiny_run
    out = tmp_path / "model.pt"
    with pytest.raises(ConfigError, match=re.escape(key)):  # from the config itself or from pretrain
        pretrain(_cfg(**pre), d / "corpus.txt", d / "tok.json", out, progress=False)
    assert not out.exists()


def test_bad_model_override_names_the_key(tiny_run, tmp_path):
    d, _, _ = tiny_run
    cfg = _cfg()
    cfg.model.overrides["num_layer"] = 2
    with pytest.raises(ConfigError, match="model.overrides"):
        pretrain(cfg, d / "corpus.txt", d / "tok.json", tmp_path / "m.pt", progress=False)
