"""The generator's weight history with ``policy_lag`` L > 1: the last L versions, kept on the host
(pinned where the model is on a GPU), the oldest copy's buffers reused for the newest."""

from __future__ import annotations

from collections import deque

import pytest
import torch
from torch import nn

from rlpipe.trainer.actors.generator import Generator


def _generator(device: str, lag: int = 3) -> Generator:
    g = Generator.__new__(Generator)  # the history alone: no checkpoint, tokenizer or Ray
    g.model, g.device, g.lag, g.version = nn.Linear(4, 3).to(device), torch.device(device), lag, 0
    g._history = deque(maxlen=lag)
    return g


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU"))])
def test_the_history_keeps_the_last_versions_on_the_host(device):
    g = _generator(device)
    ptrs = {}
    for version in range(5):
        with torch.no_grad():
            g.model.weight.fill_(version)
        g.version = version
        g._remember()
        ptrs[version] = g._history[-1][1]["weight"].data_ptr()
    assert [v for v, _ in g._history] == [2, 3, 4]
    for version, weights in g._history:
        assert torch.equal(weights["weight"], torch.full((3, 4), float(version)))
        assert all(t.device.type == "cpu" and t.is_pinned() == (device == "cuda") for t in weights.values())
    assert ptrs[3] == ptrs[0] and ptrs[4] == ptrs[1]  # the evicted copies' buffers, refilled
    assert g.model.weight.device.type == device  # the model itself stays where it is
