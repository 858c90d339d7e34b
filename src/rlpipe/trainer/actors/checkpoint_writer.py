"""The learner's checkpoint writes, off the training loop: the state is copied at the save call, the
file is written on a thread while training goes on.

A checkpoint is the model's and the optimizer's state (weights plus two AdamW moments: three times
the weights) serialised, hashed and written: on CPU a large share of a step at the presets' sizes,
and for seed 001's 1.5B-parameter policy tens of seconds. ``save`` copies the state (to the CPU: a
copy at memory or device-link speed, and the next optimizer step can no longer change what is
written), then ``rlpipe.lm.checkpoint.save_checkpoint`` writes it on the writer thread, atomically as
always (the previous ``last.pt`` stays until the new one is complete and renamed). One write at a
time: a ``save`` first waits for the previous one. ``wait`` returns once the last write is on disk
and raises its failure (a full disk, a non-finite value) as the error the save would have raised;
the driver calls it before it counts a checkpoint as written (``rlpipe.trainer.drivers.checkpoints``'s
``Checkpoints.confirm``: before the run is marked finished, and before a stop). A process killed mid-write leaves the
previous checkpoint and a temporary file that the next run deletes.
"""

from __future__ import annotations

import threading

import torch

from rlpipe.lm.checkpoint import save_checkpoint


class _Frozen:
    """What ``save_checkpoint`` reads of a model (``state_dict()``, ``config``) or an optimizer
    (``state_dict()``), as CPU copies taken when the checkpoint was asked for."""

    def __init__(self, state: dict, config=None):
        self._state, self.config = state, config

    def state_dict(self) -> dict:
        return self._state


def cpu_copy(obj):
    """``obj`` (a state dict, nested dicts/lists of tensors and scalars) with every tensor copied to
    the CPU; tensors shared by several entries (tied weights) stay shared."""
    seen: dict[tuple, torch.Tensor] = {}

    def copy(x):
        if isinstance(x, torch.Tensor):
            key = (x.data_ptr(), x.dtype, tuple(x.shape), x.stride(), x.device)
            if key not in seen:
                seen[key] = x.detach().to("cpu", copy=True)
            return seen[key]
        if isinstance(x, dict):
            return {k: copy(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(copy(v) for v in x)
        return x

    return copy(obj)


class CheckpointWriter:
    """Checkpoint writes on a thread, one at a time (``background=False``: in the caller)."""

    def __init__(self, background: bool = True):
        self.background = background
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, path: str, model, optimizer, *, tokenizer, extra: dict, hf_pretrained=None) -> None:
        self.wait()
        model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the module's own names
        frozen = _Frozen(cpu_copy(model.state_dict()), getattr(model, "config", None))
        opt = _Frozen(cpu_copy(optimizer.state_dict()))

        def write():
            save_checkpoint(path, frozen, tokenizer=tokenizer, optimizer=opt, extra=extra, hf_pretrained=hf_pretrained)

        if not self.background:
            return write()
        self._thread = threading.Thread(target=self._run, args=(write,), name="rlpipe-checkpoint", daemon=True)
        self._thread.start()

    def _run(self, write) -> None:
        try:
            write()
        except BaseException as e:  # raised by the next wait (the driver's, or the next save)
            self._error = e

    def wait(self) -> None:
        """Until the last write is on disk; raises its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        err, self._error = self._error, None
        if err is not None:
            raise err
