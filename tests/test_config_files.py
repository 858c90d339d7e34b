"""The checked-in config files and schema: they parse, carry the values the seeds and the plan
ask for, and a bad config fails with the offending key's name (rlpipe.config and the schema)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from snakemake.utils import update_config

from rlpipe.config import ConfigError, json_schema, load_config, parse_config, resolve_variant, variant_gpus

ROOT = Path(__file__).resolve().parents[1]
EXPECTED_VARIANTS = {"onpolicy", "k2", "k4", "k8", "disagg", "disagg_rdt", "replay", "kl_penalty"}


def overlay(*names: str) -> dict:
    """Merge config files the way Snakemake does (configfile, then each --configfile), then drop
    variants set to null as workflow/rules/common.smk does."""
    merged: dict = {}
    for name in names:
        update_config(merged, yaml.safe_load((ROOT / "config" / name).read_text()))
    merged["variants"] = {k: v for k, v in merged.get("variants", {}).items() if v is not None}
    return merged


def test_checked_in_schema_is_generated():
    on_disk = json.loads((ROOT / "workflow/schemas/config.schema.json").read_text())
    assert on_disk == json_schema(), (
        "workflow/schemas/config.schema.json is stale; regenerate it with\n"
        "rlpipe schema > workflow/schemas/config.schema.json")


def test_default_config_is_the_scaled_down_cpu_run():
    cfg = load_config(ROOT / "config/config.yaml")
    assert set(cfg.variants) == EXPECTED_VARIANTS
    t = cfg.train
    assert (t.n_grpo_steps, t.rollout_batch_size, t.group_size, t.train_batch_size) == (16, 32, 4, 32)
    assert (t.sampling_max_tokens, t.val_every, t.val_size, t.threads) == (40, 4, 64, 1)
    assert t.n_grpo_steps % 8 == 0 and cfg.model.preset == "cpu-tiny" and t.device == "cpu"
    # seed 000 §3.1.2 values kept
    assert (t.learning_rate, t.sampling_temperature, t.loss_type, t.use_std_normalization) == (
        5e-4, 0.8, "grpo_clip", True)
    modes = {v: resolve_variant(cfg, v) for v in cfg.variants}
    assert modes["onpolicy"].mode == "colocated_sync"
    assert [modes[f"k{k}"].k for k in (2, 4, 8)] == [2, 4, 8]
    assert modes["disagg"].weight_sync.transport == "object_store"
    assert (modes["disagg_rdt"].weight_sync.transport, modes["disagg_rdt"].weight_sync.backend) == ("rdt", "gloo")
    assert modes["replay"].replay.enabled and modes["replay"].mode == "disaggregated"
    assert modes["kl_penalty"].kl_coef == 0.05 and modes["kl_penalty"].mode == "colocated_sync"
    assert all(variant_gpus(cfg, v) == 0 for v in cfg.variants)
    assert cfg.workflow.threads_per_variant == 2  # = the machine's cores: one training job at a time


def test_gpu_overlay_is_the_assignment_scale():
    cfg = parse_config(overlay("config.yaml", "gpu.yaml"))
    t = cfg.train
    assert cfg.model.preset == "assignment" and t.device == "cuda"
    assert (t.learning_rate, t.group_size, t.sampling_temperature, t.sampling_max_tokens) == (5e-4, 4, 0.8, 60)
    assert (t.loss_type, t.use_std_normalization, t.advantage_eps) == ("grpo_clip", True, 1e-8)
    assert t.n_grpo_steps % 8 == 0 and abs(t.n_grpo_steps - 100) <= 4
    gpus = {v: variant_gpus(cfg, v) for v in cfg.variants}
    assert gpus == {"onpolicy": 1, "k2": 1, "k4": 1, "k8": 1, "kl_penalty": 1,
                    "disagg": 2, "disagg_rdt": 2, "replay": 2}
    rdt = resolve_variant(cfg, "disagg_rdt").weight_sync
    assert (rdt.transport, rdt.backend) == ("rdt", "nccl")


def test_smoke_overlay_is_tiny():
    cfg = parse_config(overlay("config.yaml", "smoke.yaml"))
    assert set(cfg.variants) == {"onpolicy", "k2", "disagg"}
    assert any(resolve_variant(cfg, v).mode == "disaggregated" for v in cfg.variants)
    assert cfg.train.n_grpo_steps <= 4 and cfg.pretrain.max_steps <= 50
    assert cfg.workflow.run_tests is False and cfg.model.overrides
    # smoke.yaml also stands alone (run from a directory without config/config.yaml)
    alone = parse_config(overlay("smoke.yaml"))
    assert set(alone.variants) == set(cfg.variants)


BAD = [
    ({"train": {"lerning_rate": 0.1}}, "train.lerning_rate"),
    ({"train": {"n_grpo_steps": "many"}}, "train.n_grpo_steps"),
    ({"workflow": {"run_tests": "yes"}}, "workflow.run_tests"),
    ({"variants": {"k2": {"k": 5}}}, "variants.k2"),
    ({"variants": {"k2": {"bogus": 1}}}, "variants.k2.bogus"),
    ({"variants": {"disagg": {"weight_sync.transport": "carrier_pigeon"}}}, "variants.disagg.weight_sync.transport"),
]


@pytest.mark.parametrize("bad,key", BAD)
def test_bad_config_names_the_key(tmp_path, bad, key):
    data = copy.deepcopy(yaml.safe_load((ROOT / "config/config.yaml").read_text()))
    update_config(data, bad)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(path)


@pytest.mark.parametrize("bad,key", BAD[:3])
def test_schema_rejects_bad_sections(bad, key):
    data = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    update_config(data, bad)
    with pytest.raises(jsonschema.ValidationError) as err:
        jsonschema.validate(data, json_schema())
    leaf = key.split(".")[-1]
    assert leaf in str(err.value)
