"""Replay buffer: FIFO capacity, aging by policy version, both samplers, determinism, reuse counts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from rlpipe.rl.records import RolloutBatch
from rlpipe.rl.replay import SAMPLERS, ReplayBuffer


@dataclass
class G:
    name: str
    policy_version: int


def names(items) -> list[str]:
    return [g.name for g in items]


def test_capacity_evicts_oldest_inserted_first():
    buf = ReplayBuffer(capacity=3, max_age=100)
    buf.add([G("a", 0), G("b", 0)], current_version=0)
    buf.add([G("c", 1), G("d", 1), G("e", 1)], current_version=1)
    assert names(buf.items()) == ["c", "d", "e"]
    assert buf.evicted == {"capacity": 2, "age": 0}


def test_max_age_drops_groups_older_than_current_minus_max_age():
    buf = ReplayBuffer(capacity=10, max_age=1)
    buf.add([G("v3", 3), G("v4", 4), G("v5", 5)], current_version=5)
    assert names(buf.items()) == ["v4", "v5"]  # 3 < 5 - 1
    buf.sample(1, current_version=6)  # sampling ages the buffer too: 4 < 6 - 1
    assert names(buf.items()) == ["v5"]
    assert buf.evicted == {"capacity": 0, "age": 2}
    zero = ReplayBuffer(capacity=10, max_age=0)
    zero.add([G("old", 1), G("new", 2)], current_version=2)
    assert names(zero.items()) == ["new"]


def test_recency_order_hand_computed():
    # key (age + uses, age, -insertion); current version 5
    buf = ReplayBuffer(capacity=10, max_age=10, strategy="recency")
    buf.add([G("A", 5), G("B", 5), G("C", 4), G("D", 3)], current_version=5)
    # keys A(0,0,0) B(0,0,-1) C(1,1,-2) D(2,2,-3): later insertion wins the tie
    assert names(buf.sample(2, 5)) == ["B", "A"]
    # A(1,0,0) B(1,0,-1) C(1,1,-2): the tie on age+uses goes to the newer version
    assert names(buf.sample(2, 5)) == ["B", "A"]
    # A(2,0,0) B(2,0,-1) C(1,1,-2) D(2,2,-3): the unused stale C is now cheaper than twice-used B, A
    assert names(buf.sample(2, 5)) == ["C", "B"]
    assert buf.uses() == [2, 3, 1, 0]
    m = buf.metrics()
    assert m["replay/sample_age_mean"] == 0.5 and m["replay/sample_age_max"] == 1
    assert m["replay/uses_mean"] == 2.0 and m["replay/uses_max"] == 3
    assert m["replay/size"] == 4


def test_recency_is_deterministic_regardless_of_seed():
    def run(seed):
        buf = ReplayBuffer(capacity=8, max_age=3, strategy="recency", seed=seed)
        out = []
        for v in range(6):
            buf.add([G(f"{v}{j}", v) for j in range(3)], current_version=v)
            out.append(names(buf.sample(2, v)))
        return out

    assert run(0) == run(123)


def test_uniform_is_seeded_distinct_and_covers_the_buffer():
    def run(seed):
        buf = ReplayBuffer(capacity=10, max_age=5, strategy="uniform", seed=seed)
        buf.add([G(str(i), 0) for i in range(10)], current_version=0)
        return [names(buf.sample(4, 0)) for _ in range(50)], buf

    draws, buf = run(7)
    assert draws == run(7)[0]
    assert draws != run(8)[0]
    assert all(len(set(d)) == 4 for d in draws)  # no replacement within a draw
    assert sum(buf.uses()) == 200 and min(buf.uses()) > 0  # every group reused
    assert buf.metrics()["replay/uses_max"] >= 2


def test_bad_arguments_name_the_key():
    with pytest.raises(ValueError, match="capacity_groups"):
        ReplayBuffer(capacity=0, max_age=1)
    with pytest.raises(ValueError, match="max_age"):
        ReplayBuffer(capacity=1, max_age=-1)
    with pytest.raises(ValueError, match="'fifo' is not one of"):
        ReplayBuffer(capacity=1, max_age=1, strategy="fifo")
    buf = ReplayBuffer(capacity=4, max_age=1)
    buf.add([G("a", 0)], current_version=0)
    with pytest.raises(ValueError, match="cannot sample 2 groups"):
        buf.sample(2, current_version=0)
    assert set(SAMPLERS) == {"uniform", "recency"}


def _batch(version: int, rewards: list[float], g: int = 2) -> RolloutBatch:
    b = len(rewards)
    return RolloutBatch(
        prompts=[f"p{i // g}" for i in range(b)], ground_truths=[None] * b,
        prompt_ids=[[1]] * b, response_ids=[[2, 3]] * b, responses=["x"] * b,
        behaviour_logprobs=[torch.zeros(2)] * b, finish_reasons=["eos"] * b,
        policy_version=version, group_size=g, rewards=torch.tensor(rewards),
        advantages=torch.tensor(rewards) * 10)


def test_whole_groups_round_trip_through_rollout_batches():
    buf = ReplayBuffer(capacity=8, max_age=2, strategy="recency")
    buf.add_batch(_batch(0, [0.0, 1.0, 2.0, 3.0]), current_version=0)
    buf.add_batch(_batch(1, [4.0, 5.0, 6.0, 7.0]), current_version=1)
    assert len(buf) == 4
    batch = RolloutBatch.concat(buf.sample(3, current_version=1))
    # newest version first, latest insertion first; rows of a group stay together and in order
    assert batch.rewards.tolist() == [6.0, 7.0, 4.0, 5.0, 2.0, 3.0]
    assert batch.advantages.tolist() == [60.0, 70.0, 40.0, 50.0, 20.0, 30.0]
    assert batch.versions().tolist() == [1, 1, 1, 1, 0, 0]
    assert batch.prompts == ["p1", "p1", "p0", "p0", "p1", "p1"]
