"""The HuggingFace policy backend (MATH track): loading, checkpoints, weight sync, gradient
checkpointing, the pre-Ray input checks and auto-resolution of ``recompute_old_log_probs``, and two
GRPO steps end to end on a tiny random-init Qwen2 with the MATH fixture (colocated and
disaggregated, under Ray). Nothing is downloaded: the model is built by ``conftest.tiny_qwen``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from rlpipe import contract
from rlpipe.config import TrainConfig
from rlpipe.lm.checkpoint import CheckpointError, load_checkpoint, load_training_state
from rlpipe.lm.policy import for_training, load_policy
from rlpipe.trainer.weight_sync import copy_weights

TIED = ("lm_head.weight", "model.embed_tokens.weight")


def _perturb(model: torch.nn.Module, scale: float = 0.1) -> None:
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --------------------------------------------------------------------------- loading, checkpoints


def test_load_policy_from_hf_dir(tiny_qwen):
    pol = load_policy(tiny_qwen)
    assert pol.kind == "hf" and pol.hf_pretrained == str(Path(tiny_qwen).resolve())
    assert all(p.dtype == torch.float32 for p in pol.model.parameters())  # CPU: always fp32
    assert pol.model.lm_head.weight is pol.model.model.embed_tokens.weight  # tied
    assert pol.tokenizer.eos_token_id == pol.tokenizer.pad_token_id


def test_hf_checkpoint_round_trip_keeps_tied_weights_once(tiny_qwen, tmp_path):
    pol = load_policy(tiny_qwen)
    _perturb(pol.model)
    opt = torch.optim.AdamW(pol.model.parameters())
    pol.save(tmp_path / "last.pt", optimizer=opt, extra={"step": 3})
    raw = torch.load(tmp_path / "last.pt", weights_only=True)
    assert raw["model_config"] == {"hf_pretrained": str(Path(tiny_qwen).resolve())}
    assert raw["model"][TIED[0]].data_ptr() == raw["model"][TIED[1]].data_ptr()  # stored once
    back = load_policy(tmp_path / "last.pt")
    assert back.kind == "hf" and _same(back.model, pol.model)
    assert back.model.lm_head.weight is back.model.model.embed_tokens.weight
    fresh = load_policy(tiny_qwen).model
    assert not _same(fresh, pol.model)
    opt_state, extra = load_training_state(fresh, tmp_path / "last.pt")  # the learner's resume path
    assert _same(fresh, pol.model) and extra == {"step": 3} and opt_state is not None


def test_hf_checkpoint_refuses_when_its_model_dir_is_gone(tiny_qwen, tmp_path):
    moved = tmp_path / "qwen"
    shutil.copytree(tiny_qwen, moved)
    load_policy(moved).save(tmp_path / "ck.pt")
    shutil.rmtree(moved)
    with pytest.raises(CheckpointError, match=r"ck\.pt holds an HF policy built from .*qwen, which is gone"):
        load_checkpoint(tmp_path / "ck.pt")


def test_hf_checkpoint_into_a_transformer_lm_is_refused(tiny_qwen, tiny_base, tmp_path):
    load_policy(tiny_qwen).save(tmp_path / "ck.pt")
    with pytest.raises(CheckpointError, match=r"ck\.pt holds an HF policy but the model is a TransformerLM"):
        load_training_state(load_policy(tiny_base[0]).model, tmp_path / "ck.pt")


def test_weight_sync_copies_hf_weights_with_tied_embeddings(tiny_qwen):
    src, dst = load_policy(tiny_qwen).model, load_policy(tiny_qwen).model
    _perturb(src)
    assert not _same(src, dst)
    stats = copy_weights(src, dst, version=1)
    assert _same(src, dst) and dst.lm_head.weight is dst.model.embed_tokens.weight
    n_bytes = sum(p.numel() * p.element_size() for p in src.parameters())  # parameters() dedupes tied ones
    assert stats.bytes == n_bytes


# --------------------------------------------------------------------------- gradient checkpointing


def test_gradient_checkpointing_same_gradients(tiny_base, tiny_qwen):
    """Both backends: recomputing activations changes memory, not the gradients."""
    for base in (tiny_base[0], str(tiny_qwen)):
        grads = []
        for ckpt in (False, True):
            model = for_training(load_policy(base).model, gradient_checkpointing=ckpt).train()
            ids = torch.arange(1, 25).reshape(2, 12)  # (B, T)
            out = model(ids)
            logits = out if isinstance(out, torch.Tensor) else out.logits  # (B, T, V)
            logits.float().logsumexp(-1).mean().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            uses = getattr(model, "gradient_checkpointing", None) if base == tiny_base[0] else \
                getattr(model, "is_activation_checkpointing", None)
            assert uses is ckpt, base
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads, strict=True)), base


# --------------------------------------------------------------------------- pre-Ray checks


def test_check_base_accepts_an_hf_dir_and_names_what_is_missing(tiny_qwen, tmp_path):
    from rlpipe.trainer.run import InputError, _check_base

    assert _check_base(str(tiny_qwen)) == str(Path(tiny_qwen).resolve())
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=rf"{empty} is a directory but not a HuggingFace model directory"):
        _check_base(str(empty))
    no_tok = tmp_path / "no_tok"
    shutil.copytree(tiny_qwen, no_tok)
    (no_tok / "tokenizer.json").unlink()
    with pytest.raises(InputError, match=rf"{no_tok} has no tokenizer.json"):
        _check_base(str(no_tok))
    bad_tok = tmp_path / "bad_tok"
    shutil.copytree(tiny_qwen, bad_tok)
    (bad_tok / "tokenizer.json").write_text("{not json")
    with pytest.raises(InputError, match=rf"the tokenizer in {bad_tok} .* cannot be loaded"):
        _check_base(str(bad_tok))
    small = tmp_path / "small_vocab"
    shutil.copytree(tiny_qwen, small)
    cfg = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps(cfg | {"vocab_size": 10}))
    with pytest.raises(InputError, match=r"config.json only vocab_size=10"):
        _check_base(str(small))


def test_recompute_auto_resolution(tiny_qwen, tiny_base):
    from rlpipe.trainer.run import resolve_recompute

    auto = TrainConfig()
    assert resolve_recompute(auto, str(tiny_qwen)).recompute_old_log_probs is True
    assert resolve_recompute(auto, tiny_base[0]).recompute_old_log_probs is False
    assert resolve_recompute(TrainConfig(dtype="bfloat16"), tiny_base[0]).recompute_old_log_probs is True
    assert resolve_recompute(TrainConfig(recompute_old_log_probs=False), str(tiny_qwen)).recompute_old_log_probs \
        is False
    assert auto.recompute_old_log_probs is None  # resolved on a copy


def test_reference_model_only_when_needed():
    from rlpipe.trainer.actors import reference

    assert reference.needed(TrainConfig())  # kl_monitor defaults on
    assert not reference.needed(TrainConfig(kl_monitor=False))
    assert reference.needed(TrainConfig(kl_monitor=False, kl_coef=0.1))


# --------------------------------------------------------------------------- end to end (Ray)

MATH_TRAIN = {"task": "math", "sampling_max_tokens": 20, "sampling_temperature": 1.0, "val_size": 3,
              "learning_rate": 3e-3}
MATH_VARIANTS = {"hf_colocated": {"mode": "colocated_sync", "kl_monitor": False},
                 "hf_disagg": {"mode": "disaggregated", "gradient_checkpointing": True}}


@pytest.mark.ray
@pytest.mark.parametrize("variant", ["hf_colocated", pytest.param("hf_disagg", marks=pytest.mark.slow)])
def test_two_grpo_steps_on_tiny_qwen(variant, ray_session, tiny_qwen, math_fixture, write_config, tmp_path):
    from rlpipe.trainer.run import run

    cfg = write_config(tmp_path / "config.yaml", train=MATH_TRAIN, variants=MATH_VARIANTS)
    out = tmp_path / variant
    run(str(cfg), variant, str(out), str(tiny_qwen), str(math_fixture), threads=2)
    m = pd.read_parquet(out / contract.METRICS_FILE)
    assert m["step"].tolist() == [0, 1, 2] and list(m.columns) == list(contract.METRIC_COLUMNS)
    trained = m[m.step > 0]
    assert all(math.isfinite(x) for x in trained["loss/policy"])
    for col in ("reward/format_mean", "reward/answer_mean", "logprob/sampler_gap", "time/old_logprobs"):
        assert trained[col].notna().all(), col
    assert (trained["logprob/sampler_gap"] >= 0).all()
    for col in ("reward/val_mean", "reward/val_format_mean", "reward/val_answer_mean"):
        assert m[col].notna().all(), col  # val_every=1: steps 0, 1, 2
    kl_ref = m["kl/ref_k3"]
    assert kl_ref.isna().all() if variant == "hf_colocated" else trained["kl/ref_k3"].notna().all()
    assert trained["kl/prev_k3"].notna().all()
    info = json.loads((out / contract.RUN_INFO_FILE).read_text())
    assert info["config"]["recompute_old_log_probs"] is True  # auto, resolved for an HF base
    last = load_policy(out / contract.CHECKPOINT_FILE)
    base = load_policy(tiny_qwen)
    assert last.kind == "hf" and not _same(last.model, base.model)  # GRPO changed the parameters
