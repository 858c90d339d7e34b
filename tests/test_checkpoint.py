"""Checkpoint round trip, mismatch reporting, refusal of pickled code and of corrupted content."""

import os
import random

import numpy as np
import pytest
import torch

from rlpipe.lm.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_model_state,
    save_checkpoint,
    save_payload,
)
from rlpipe.lm.model import ModelConfig, TransformerLM

CFG = ModelConfig(vocab_size=50, context_length=32, num_layers=2, d_model=16, num_heads=2, d_ff=32, rope_theta=500.0)


def _trained_model_and_optimizer():
    torch.manual_seed(0)
    model = TransformerLM(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 50, (2, 8))
    for _ in range(2):
        loss = model(x).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def test_round_trip_restores_weights_config_optimizer_and_extra(tmp_path):
    model, opt = _trained_model_and_optimizer()
    extra = {"step": 7, "version": 3, "torch_rng": torch.get_rng_state(), "py_rng": random.getstate()}
    path = tmp_path / "ck.pt"
    save_checkpoint(path, model, tokenizer="runs/tok/tokenizer.json", optimizer=opt, extra=extra)
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]  # atomic: no temp file left behind

    ck = load_checkpoint(path)
    assert ck.model_config == CFG and ck.tokenizer == "runs/tok/tokenizer.json"
    for (k, a), (k2, b) in zip(model.state_dict().items(), ck.model.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b)
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in ck.model.parameters())
    x = torch.randint(0, 50, (1, 6))
    assert torch.equal(model(x), ck.model(x))

    opt2 = torch.optim.AdamW(ck.model.parameters(), lr=1e-2)
    opt2.load_state_dict(ck.optimizer_state)
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for pid, st in s1["state"].items():
        for key, val in st.items():
            assert torch.equal(val, s2["state"][pid][key]), (pid, key)
    assert ck.extra["step"] == 7 and torch.equal(ck.extra["torch_rng"], extra["torch_rng"])
    assert tuple(ck.extra["py_rng"][1]) == extra["py_rng"][1]


def test_load_model_state_into_existing_model(tmp_path):
    model, _ = _trained_model_and_optimizer()
    save_checkpoint(tmp_path / "ck.pt", model, tokenizer=None, extra={"version": 5})
    other = TransformerLM(CFG)
    assert load_model_state(other, tmp_path / "ck.pt") == {"version": 5}
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters(), strict=True))
    with pytest.raises(CheckpointError, match="d_ff"):
        load_model_state(TransformerLM(CFG.replace(d_ff=48)), tmp_path / "ck.pt")


def test_mismatched_checkpoint_names_every_bad_key(tmp_path):
    model, _ = _trained_model_and_optimizer()
    path = tmp_path / "ck.pt"
    save_checkpoint(path, model, tokenizer=None)
    payload = torch.load(path, weights_only=True)
    del payload["model"]["layers.1.ffn.w3.weight"]
    payload["model"]["layers.0.attn.bias"] = torch.zeros(3)
    payload["model"]["layers.0.ffn.w1.weight"] = torch.zeros(5, 16)
    save_payload(path, payload)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    msg = str(err.value)
    assert "layers.1.ffn.w3.weight" in msg and "layers.0.attn.bias" in msg
    assert "layers.0.ffn.w1.weight" in msg and "(32, 16)" in msg and "(5, 16)" in msg


def _touch(path):  # the "payload" a malicious pickle would run
    open(path, "w").close()


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (_touch, (self.marker,))


def test_pickled_object_is_refused_and_not_executed(tmp_path):
    marker = str(tmp_path / "pwned")
    path = tmp_path / "evil.pt"
    torch.save({"format": "rlpipe.lm.checkpoint", "version": 1, "model_config": CFG.to_dict(), "model": {},
                "extra": {"x": _Evil(marker)}}, path)
    with pytest.raises(CheckpointError, match="weights-only"):
        load_checkpoint(path)
    assert not os.path.exists(marker)
    torch.load(path, weights_only=False)  # proves the file really carries code
    assert os.path.exists(marker)


def test_extra_that_weights_only_cannot_load_is_rejected_before_writing(tmp_path):
    model, _ = _trained_model_and_optimizer()
    path = tmp_path / "ck.pt"
    save_checkpoint(path, model, tokenizer=None, extra={"step": 1})
    before = path.read_bytes()
    with pytest.raises(TypeError, match=r"extra\['np_rng'\]"):
        save_checkpoint(path, model, tokenizer=None, extra={"np_rng": np.zeros(3)})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["ck.pt"]


def test_foreign_files_are_rejected(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "x.pt")
    with pytest.raises(CheckpointError, match="not an rlpipe checkpoint"):
        load_checkpoint(tmp_path / "x.pt")
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(TypeError, match="TransformerLM"):
        save_checkpoint(tmp_path / "y.pt", torch.nn.Linear(2, 2), tokenizer=None)


@pytest.mark.parametrize("content, cause", [
    (b"not a checkpoint", "not a torch checkpoint file"),  # another kind of file
    (b"", "not a torch checkpoint file"),  # empty
    ("half", "not a torch checkpoint file"),  # truncated: the zip's central directory is gone
])
def test_unreadable_files_name_the_file_and_the_cause(tmp_path, content, cause):
    model, _ = _trained_model_and_optimizer()
    path = tmp_path / "ck.pt"
    save_checkpoint(path, model, tokenizer=None)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if content == "half" else content)
    with pytest.raises(CheckpointError, match=cause) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)


def test_bit_flipped_tensor_is_refused_naming_the_file(tmp_path, flip_tensor_bytes):
    """400 bytes inverted inside a tensor's storage: the zip is intact and torch loads it without a
    word (its reader ignores the zip CRCs); the recorded sha256 does not match, naming the file."""
    model, opt = _trained_model_and_optimizer()
    path = tmp_path / "last.pt"
    save_checkpoint(path, model, tokenizer=None, optimizer=opt, extra={"step": 3})
    load_checkpoint(path)
    flip_tensor_bytes(path, 400)
    payload = torch.load(path, weights_only=True)  # torch alone: silent
    assert any(not torch.equal(payload["model"][k], v) for k, v in model.state_dict().items())
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    msg = str(err.value)
    assert msg == (f"checkpoint {path} is corrupt: its content does not match the sha256 recorded when it was "
                   "written (changed on disk or in a copy)")
    with pytest.raises(CheckpointError, match="is corrupt"):
        load_model_state(TransformerLM(CFG), path)


def test_checkpoint_without_a_checksum_still_loads(tmp_path):
    """A checkpoint of an older rlpipe (no ``sha256`` entry) loads unverified; one with a checksum
    that is not the content's is refused even when the change is a single value."""
    model, _ = _trained_model_and_optimizer()
    path = tmp_path / "old.pt"
    save_checkpoint(path, model, tokenizer=None, extra={"step": 1})
    payload = torch.load(path, weights_only=True)
    assert len(payload.pop("sha256")) == 64
    torch.save(payload, path)
    assert load_checkpoint(path).extra == {"step": 1}
    payload["sha256"] = "0" * 64
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="is corrupt"):
        load_checkpoint(path)


def test_non_finite_weights_are_never_written_and_never_loaded(tmp_path):
    model, opt = _trained_model_and_optimizer()
    path = tmp_path / "last.pt"
    save_checkpoint(path, model, tokenizer=None, optimizer=opt, extra={"step": 3})
    before = path.read_bytes()
    with torch.no_grad():
        model.layers[1].ffn.w2.weight[0, 0] = float("inf")
    with pytest.raises(CheckpointError, match=r"refusing to write .*last.pt.*layers\.1\.ffn\.w2\.weight \(1 of"):
        save_checkpoint(path, model, tokenizer=None, optimizer=opt, extra={"step": 4})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    # a file poisoned some other way (written by an older rlpipe, or by hand) is refused on load
    payload = torch.load(path, weights_only=True)
    payload["model"]["layers.0.attn.q_proj.weight"] = torch.full((16, 16), float("nan"))
    save_payload(path, payload)
    with pytest.raises(CheckpointError, match=r"last.pt is poisoned.*layers\.0\.attn\.q_proj\.weight \(256 of 256"):
        load_checkpoint(path)
