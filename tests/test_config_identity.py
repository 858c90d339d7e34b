"""rlpipe.config.identity: every config key is placed on one side of the identity/operational line,
and what each side does to fingerprints and Snakemake params."""

from __future__ import annotations

import typing

from rlpipe.config import PipelineConfig, parse_config, to_dict
from rlpipe.config.base import _section_class
from rlpipe.config.identity import IDENTITY_KEYS, OPERATIONAL_KEYS, canonical_key, identity

#: The operational side, written out: changing one of these reruns nothing and resumes a run.
OPERATIONAL = {
    "train.ray_timeout_s", "train.actor_start_timeout_s", "train.weight_sync.timeout_s", "train.threads",
    "train.checkpoint_every",
    "train.log_rollouts_every", "pretrain.threads", "logging.trackers", "logging.tensorboard", "logging.flush_every_s",
    "ray.address",
    "ray.include_dashboard", "ray.num_cpus", "workflow.results_dir", "workflow.family_threads",
    "workflow.threads_per_variant", "workflow.slurm_account", "workflow.slurm_partition",
    "workflow.slurm_gpu_partition", "workflow.nodes_per_disaggregated",
}


def every_key(cls=PipelineConfig, prefix: str = ""):
    """Every leaf key of the config models (a table's entries as ``*``)."""
    for name, field in cls.model_fields.items():
        key, ann = f"{prefix}.{name}" if prefix else name, field.annotation
        if typing.get_origin(ann) is dict and _section_class(typing.get_args(ann)[1]):
            yield from every_key(_section_class(typing.get_args(ann)[1]), f"{key}.*")
        elif _section_class(ann):
            yield from every_key(_section_class(ann), key)
        else:
            yield key


def test_every_key_is_placed_on_exactly_one_side():
    keys = {canonical_key(k) for k in every_key()}
    identity_keys = set(IDENTITY_KEYS)
    assert set(OPERATIONAL_KEYS) == OPERATIONAL
    assert not identity_keys & OPERATIONAL, "placed on both sides"
    unplaced = keys - identity_keys - OPERATIONAL
    assert not unplaced, f"place these keys in rlpipe.config.identity (IDENTITY_KEYS or OPERATIONAL_KEYS): {unplaced}"
    assert not (identity_keys | OPERATIONAL) - keys, "no such config key"
    assert len(IDENTITY_KEYS) == len(identity_keys), "listed twice"


def test_every_key_includes_the_nested_tables():
    keys = set(every_key())
    assert {"tracks.*.pretrain.threads", "math.pretrain.threads", "families.*.replicates"} <= keys
    assert canonical_key("tracks.*.pretrain.threads") == "pretrain.threads"


def test_identity_drops_operational_keys_at_every_depth():
    train = to_dict(parse_config({}).train)
    ident = identity(train, "train")
    assert "ray_timeout_s" not in ident and "threads" not in ident
    assert "timeout_s" not in ident["weight_sync"] and ident["weight_sync"]["transport"] == train["weight_sync"][
        "transport"]
    assert ident["learning_rate"] == train["learning_rate"]
    assert "threads" not in identity(to_dict(parse_config({}).pretrain), "pretrain")


def test_content_keys_enter_by_content(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("{q}")
    b.write_text("{q}")
    view = lambda p: identity({"text": {"template_file": str(p), "reward": "pkg.mod:fn"}}, "train")  # noqa: E731
    assert view(a) == view(b) and view(a)["text"]["template_file"].startswith("sha256:")
    assert view(a)["text"]["reward"] == "pkg.mod:fn"
    b.write_text("{p}")
    assert view(a) != view(b)
