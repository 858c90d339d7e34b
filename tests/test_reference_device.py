"""The reference log-probs stay on the device they were computed on.

The reference model and the learner share one actor in both placements (``ColocatedWorker``,
``LearnerWorker``), so the learner reads the reference's (B, T) log-probs where they are, with no copy
to the host and back (on a GPU, a device-to-host synchronisation every step). On CPU a copy to the host
is a no-op, so the observable is the meta device: its tensors carry no data, and any copy of one to the
host raises. The roles are used directly, without Ray.
"""

from __future__ import annotations

import pytest
import torch

from rlpipe.config.train import TrainConfig
from rlpipe.trainer.actors.workers import ColocatedWorker

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# response_only_head off: the split head selects the response rows with a data-dependent index,
# which the meta device cannot compute; the full-sequence head is the path every policy has
CFG = dict(rollout_batch_size=8, train_batch_size=8, group_size=4, sampling_max_tokens=8, val_size=3,
           device="cpu", threads=1, kl_monitor=True, response_only_head=False)


def test_reference_log_probs_are_returned_on_the_reference_device(tiny_base):
    base, data = tiny_base
    w = ColocatedWorker(base, TrainConfig(**CFG), data, threads=1)
    batch = w.rollout(0, 1)
    on_cpu = w.reference.log_probs(batch, 1, 0)  # (B, T)
    assert on_cpu.dtype == torch.float32 and on_cpu.shape[0] == len(batch)
    w.reference.model.to("meta")
    w.reference.device = torch.device("meta")
    on_meta = w.reference.log_probs(batch, 1, 0)  # a host copy (``.cpu()``) of a meta tensor raises
    assert on_meta.device.type == "meta"
    assert on_meta.shape == on_cpu.shape and on_meta.dtype == torch.float32

