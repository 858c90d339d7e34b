"""The learner's checkpoints written off the training loop: the file holds the state of the save
call, whatever training does meanwhile; the same checkpoint as a write in the caller; a failed write
is raised by the next wait and keeps the previous file."""

from __future__ import annotations

import threading

import pytest
import torch

from rlpipe.io import OutputWriteError
from rlpipe.lm.checkpoint import load_checkpoint
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.trainer.actors import checkpoint_writer
from rlpipe.trainer.actors.checkpoint_writer import CheckpointWriter


def _trained():
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig.from_preset("cpu-tiny", vocab_size=64, num_layers=1, d_model=16,
                                                  num_heads=2, d_ff=32, context_length=16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, opt)
    return model, opt


def _step(model, opt) -> None:
    x = torch.randint(0, 64, (2, 9))
    loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_file_holds_the_state_of_the_save_call_while_training_goes_on(tmp_path, monkeypatch):
    model, opt = _trained()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    want_moment = next(iter(opt.state.values()))["exp_avg"].clone()
    go, write = threading.Event(), checkpoint_writer.save_checkpoint

    def held(*a, **k):  # the writer thread starts only after training moved on
        assert go.wait(30)
        write(*a, **k)

    monkeypatch.setattr(checkpoint_writer, "save_checkpoint", held)
    w = CheckpointWriter(background=True)
    w.save(str(tmp_path / "last.pt"), model, opt, tokenizer=None, extra={"step": 1})
    _step(model, opt)  # the next optimizer step changes weights and moments in place
    assert not _same(model.state_dict(), want)
    go.set()
    w.wait()
    ck = load_checkpoint(tmp_path / "last.pt")
    assert _same(ck.model.state_dict(), want) and ck.extra["step"] == 1
    assert torch.equal(next(iter(ck.optimizer_state["state"].values()))["exp_avg"], want_moment)


def test_a_background_write_gives_the_checkpoint_a_write_in_the_caller_gives(tmp_path):
    model, opt = _trained()
    for name, background in (("bg.pt", True), ("sync.pt", False)):
        w = CheckpointWriter(background=background)
        w.save(str(tmp_path / name), model, opt, tokenizer=None, extra={"step": 1})
        w.wait()
    a, b = (load_checkpoint(tmp_path / n) for n in ("bg.pt", "sync.pt"))
    assert _same(a.model.state_dict(), b.model.state_dict()) and a.extra == b.extra
    assert a.model_config == b.model_config
    sa, sb = a.optimizer_state["state"], b.optimizer_state["state"]
    assert sa.keys() == sb.keys() and all(_same(sa[k], sb[k]) for k in sa)


def test_a_failed_write_is_raised_by_the_next_wait_and_keeps_the_previous_file(tmp_path, monkeypatch):
    model, opt = _trained()
    w = CheckpointWriter(background=True)
    w.save(str(tmp_path / "last.pt"), model, opt, tokenizer=None, extra={"step": 1})
    w.wait()
    good = (tmp_path / "last.pt").read_bytes()

    def full(path, *a, **k):
        raise OutputWriteError(f"could not write {path}: No space left on device")

    monkeypatch.setattr(checkpoint_writer, "save_checkpoint", full)
    _step(model, opt)
    w.save(str(tmp_path / "last.pt"), model, opt, tokenizer=None, extra={"step": 2})
    with pytest.raises(OutputWriteError, match="last.pt: No space left"):
        w.wait()
    w.wait()  # reported once
    assert (tmp_path / "last.pt").read_bytes() == good
