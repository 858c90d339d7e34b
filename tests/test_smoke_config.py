"""The smoke switch (rlpipe.config.smoke): its caps shrink every train section into a valid one, keep
what is already small, and touch no list but to shorten it."""

from __future__ import annotations

import pytest

from rlpipe.config import (
    SmokeConfig,
    TrainConfig,
    family_pipeline,
    from_dict,
    parse_config,
    resolve_variant,
    to_dict,
    workflow_tracks,
)
from rlpipe.config.smoke import shrink_train

S = SmokeConfig(enabled=True)


def shrunk(**train) -> TrainConfig:
    return from_dict(TrainConfig, shrink_train(to_dict(TrainConfig(**train)), S))


@pytest.mark.parametrize("train, expect", [
    (dict(n_grpo_steps=64, rollout_batch_size=128, group_size=8, train_batch_size=128), (4, 16, 16)),
    (dict(n_grpo_steps=64, mode="colocated_k", k=8, rollout_batch_size=32, group_size=4, train_batch_size=32),
     (8, 8, 8)),  # n_grpo_steps stays a multiple of k
    (dict(n_grpo_steps=63, mode="colocated_k", k=3, rollout_batch_size=32, group_size=4, train_batch_size=32),
     (3, 8, 8)),
    (dict(n_grpo_steps=2, rollout_batch_size=4, group_size=4, train_batch_size=4), (2, 4, 4)),  # already small
    (dict(n_grpo_steps=64, rollout_batch_size=96, group_size=6, train_batch_size=48, gradient_accumulation_steps=4),
     (4, 12, 12)),  # a whole-group batch divisible by the accumulation
    (dict(n_grpo_steps=64, rollout_batch_size=96, group_size=16, train_batch_size=48, gradient_accumulation_steps=3),
     None),  # no whole-group batch divides by 3: one microbatch
])
def test_shrunk_train_sections_stay_valid(train, expect):
    t = shrunk(**train)
    if expect is not None:
        assert (t.n_grpo_steps, t.rollout_batch_size, t.train_batch_size) == expect
    else:
        assert t.gradient_accumulation_steps == 1 and t.train_batch_size == 16
    assert t.val_every <= t.n_grpo_steps and t.checkpoint_every <= t.n_grpo_steps and t.val_size <= S.val_size


def test_a_track_with_a_larger_group_than_the_batch_it_inherits_still_fits():
    cfg = parse_config({
        "smoke": {"enabled": True}, "workflow": {"tracks": ["mine"], "families": []},
        "tracks": {"mine": {"dataset_command": "make {out}", "train": {"group_size": 16, "task": "text",
                                                                        "text": {"reward": "r.py:f"}}}}})
    t = resolve_variant(workflow_tracks(cfg)["mine"].pipeline, "onpolicy")
    assert (t.group_size, t.rollout_batch_size, t.train_batch_size) == (16, 16, 16)


def test_caps_reach_every_track_family_and_list_but_replace_none():
    data = {"smoke": {"enabled": True}, "workflow": {"toy_sort_seeds": [9, 8, 7], "bench_sizes_mb": [0.5, 64],
                                                     "scaling_sizes": [48, 96], "families": ["fam"]},
            "families": {"fam": {"track": "math", "replicates": 5, "base": {"n_grpo_steps": 40},
                                 "variants": {"a": {}, "b": {"learning_rate": 1e-3}}}}}
    cfg = parse_config(data)
    w = cfg.workflow
    assert (w.toy_sort_seeds, w.bench_sizes_mb, w.scaling_sizes, w.scaling_batches) == ([9, 8], [0.5], [48], [])
    assert w.families == ["fam"] and cfg.families["fam"].replicates == 2
    assert not w.bench_sampler_builds  # the sampler bench's compiled and AOT decoders: off
    assert cfg.math.eval_size == S.eval_size and cfg.pretrain.max_steps == S.pretrain_steps
    assert cfg.math.pretrain.max_steps == S.pretrain_steps
    fam = family_pipeline(cfg, "fam")
    assert {v: resolve_variant(fam, v).n_grpo_steps for v in fam.variants} == {"a": 4, "b": 4}
    off = parse_config({k: v for k, v in data.items() if k != "smoke"})
    assert off.workflow.toy_sort_seeds == [9, 8, 7] and off.families["fam"].replicates == 5
    assert off.workflow.bench_sampler_builds
    assert parse_config({**data, "smoke": {"enabled": True, "sampler_builds": True}}).workflow.bench_sampler_builds
    assert resolve_variant(family_pipeline(off, "fam"), "a").n_grpo_steps == 40


ALL_SYSTEMS_VARIANTS = {
    "onpolicy": {"mode": "colocated_sync"}, "k2": {"mode": "colocated_k", "k": 2},
    "k4": {"mode": "colocated_k", "k": 4}, "k8": {"mode": "colocated_k", "k": 8},
    "disagg": {"mode": "disaggregated", "weight_sync.transport": "object_store"},
    "disagg_rdt": {"mode": "disaggregated", "weight_sync.transport": "rdt", "weight_sync.backend": "gloo"},
    "replay": {"mode": "disaggregated", "replay.enabled": True},
    "kl_penalty": {"mode": "colocated_sync", "kl_coef": 0.05},
}


def test_a_user_track_with_every_systems_variant_and_a_family_fits_the_caps(capsys):
    """The docs' own command on a user's track with all eight variants (k8 among them) and a family:
    the shared section's steps shrink to 4, which k = 8 does not divide; k8's are rounded up to 8, said
    once."""
    cfg = parse_config({
        "smoke": {"enabled": True}, "workflow": {"tracks": ["digitsum"], "families": ["dsum_k"]},
        "tracks": {"digitsum": {"dataset_command": "make {out}", "variants": ALL_SYSTEMS_VARIANTS,
                                "train": {"n_grpo_steps": 24, "task": "text", "text": {"reward": "r.py:f"}}}},
        "families": {"dsum_k": {"track": "digitsum", "variants": {"k1": {}, "k8": {"mode": "colocated_k", "k": 8}}}}})
    track = workflow_tracks(cfg)["digitsum"].pipeline
    steps = {name: resolve_variant(track, name).n_grpo_steps for name in ALL_SYSTEMS_VARIANTS}
    assert steps == {name: 8 if name == "k8" else 4 for name in ALL_SYSTEMS_VARIANTS}
    family = family_pipeline(cfg, "dsum_k")
    assert resolve_variant(family, "k8").n_grpo_steps == 8 and resolve_variant(family, "k1").n_grpo_steps == 4
    resolve_variant(track, "k8")
    said = capsys.readouterr().err
    assert said.count("variants.k8.n_grpo_steps 4 rounded up to 8, a multiple of its k (8)") == 1, said
