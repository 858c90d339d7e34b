"""The drivers submit a round's optimizer steps at once and read the results in order.

The actor runs its calls one at a time in submission order, so it goes from one step to the next
without waiting for the driver. Observable in a run's own outputs: the driver is slowed down (a real
sleep before it logs each step), and the actor's phase events (``events.parquet``) show the next
step starting before the driver logged the previous one (its row's ``wall_time``). A driver that
waits for each result before submitting the next call can never show that: the next call leaves the
driver after the row is logged.

Divergence inside a submitted round still stops the run at the step that diverged, with nothing
after it: the calls queued behind it refuse to train (``rlpipe.trainer.actors.workers``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

from rlpipe import contract

DELAY_S = 1.0  # the driver's sleep before logging a step; the actor starts the next one within ms

# colocated: 2 rounds of k = 2 steps; disaggregated: 2 train batches per rollout batch (2 steps a round)
VARIANTS = {"k2": {"mode": "colocated_k", "k": 2, "n_grpo_steps": 4},
            "disagg_spb2": {"mode": "disaggregated", "n_grpo_steps": 2, "train_batch_size": 4},
            "k2_lr": {"mode": "colocated_k", "k": 2, "n_grpo_steps": 4, "learning_rate": 1e12}}
ACTOR = {"k2": "colocated", "disagg_spb2": "learner"}


@pytest.fixture(scope="module")
def env(tmp_path_factory, ray_session, tiny_base, write_config):
    tmp = tmp_path_factory.mktemp("drivers")
    cfg = write_config(tmp / "config.yaml", variants=VARIANTS)
    return {"tmp": tmp, "base": tiny_base[0], "data": tiny_base[1], "cfg": str(cfg)}


def _train(env, variant: str) -> Path:
    from rlpipe.trainer.run import run

    out = env["tmp"] / variant
    run(env["cfg"], variant, str(out), env["base"], env["data"], threads=2)
    return out


@pytest.mark.ray
@pytest.mark.parametrize("variant", ["k2", "disagg_spb2"])
def test_the_actor_runs_a_rounds_steps_without_waiting_for_the_driver(env, variant, monkeypatch):
    from rlpipe.trainer.drivers.step_log import StepLog

    log_update = StepLog.update

    def slow_log_update(self, step, res, batch):
        time.sleep(DELAY_S)  # the driver is slow to log: the row's wall_time is stamped after this
        return log_update(self, step, res, batch)

    monkeypatch.setattr(StepLog, "update", slow_log_update)
    out = _train(env, variant)
    m = pd.read_parquet(out / "metrics.parquet")
    assert m["step"].tolist() == [0, 1, 2, 3, 4] and m["loss/policy"].iloc[1:].notna().all()
    ev = pd.read_parquet(out / "events.parquet")
    starts = ev[(ev.actor == ACTOR[variant]) & ev.phase.isin(["ref_logprobs", "update"])].groupby("step").start.min()
    logged = m.set_index("step").wall_time
    for second in (2, 4):  # the second step of each round starts before the driver has logged the first
        assert starts[second] < logged[second - 1], (second, starts.to_dict(), logged.to_dict())


@pytest.mark.ray
def test_divergence_inside_a_submitted_round_stops_at_its_step_with_nothing_after_it(env):
    from rlpipe.trainer.drivers.ray_calls import TrainingDiverged

    with pytest.raises(TrainingDiverged) as err:
        _train(env, "k2_lr")
    assert str(err.value).startswith("update step 1: training diverged at optimizer step 1: ")
    out = env["tmp"] / "k2_lr"
    assert pd.read_parquet(out / "metrics.parquet")["step"].tolist() == [0]
    assert sorted(p.name for p in (out / contract.CHECKPOINT_DIR).iterdir()) == ["FINGERPRINT"]


@pytest.mark.usefixtures("one_torch_thread")
def test_steps_queued_behind_a_diverged_one_refuse_to_train(tiny_base):
    """No Ray: the colocated worker's calls in the order the driver submits them."""
    from rlpipe.config.train import TrainConfig
    from rlpipe.trainer.actors.learner import NonFiniteLossError
    from rlpipe.trainer.actors.workers import ColocatedWorker

    cfg = TrainConfig(rollout_batch_size=8, train_batch_size=4, group_size=4, gradient_accumulation_steps=1,
                      sampling_max_tokens=8, val_size=3, device="cpu", threads=1, learning_rate=1e12)
    w = ColocatedWorker(tiny_base[0], cfg, tiny_base[1], threads=1)
    w.rollout(0, 1)
    with pytest.raises(NonFiniteLossError, match="^training diverged at optimizer step 1: "):
        w.update_rollout(0, 0, 1)
    w.prof.drain()
    queued = "^optimizer step 2 not taken: training diverged at optimizer step 1: "
    with pytest.raises(NonFiniteLossError, match=queued):
        w.update_rollout(0, 1, 2)
    assert [e for e in w.prof.drain() if e.step == 2] == []  # neither the reference nor the update ran
