"""Every numeric config key has a valid range, and ``parse_config`` rejects a value outside it
(and NaN / infinity) with a ``ConfigError`` naming the dotted key, before any work starts.

The numeric keys are discovered from the pydantic models (``model_fields`` and their ``ge`` /
``gt`` / ``le`` / ``lt`` metadata), not listed by hand: a new numeric key is tested, and must carry
a bound, without touching this file. ``KEYS_TRIED`` lists the dotted keys the walk tries (each
case's test id starts with its key). Also here: wrong types, unknown keys ("did you mean"),
the cross-field rules, variant errors, direct construction of a section, and the generated JSON
schema (the same bounds, checked with ``jsonschema``).
"""

from __future__ import annotations

import copy
import math
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jsonschema
import pytest
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from snakemake.utils import update_config

from rlpipe.config import (
    ConfigError,
    DataConfig,
    PipelineConfig,
    PretrainConfig,
    TrainConfig,
    WeightSyncConfig,
    json_schema,
    parse_config,
    resolve_variant,
    to_dict,
)

ROOT = Path(__file__).resolve().parents[1]
BOUNDS = ("ge", "gt", "le", "lt")


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class NumericField:
    path: tuple[str, ...]  # ("train", "weight_sync", "timeout_s")
    kind: type  # int or float
    bounds: dict[str, float]  # {"ge": 1} ...
    is_list: bool  # a list of numbers (bounds apply to each item)
    default: Any

    @property
    def key(self) -> str:
        return ".".join(self.path)


def _bounds(metadata: list[Any]) -> dict[str, float]:
    out = {}
    for m in metadata:
        inner = m.metadata if isinstance(m, FieldInfo) else [m]
        for item in inner:
            for name in BOUNDS:
                if getattr(item, name, None) is not None:
                    out[name] = getattr(item, name)
    return out


def _strip_optional(ann: Any) -> Any:
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        assert len(args) == 1, f"unexpected union {ann}"
        return args[0]
    return ann


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _walk(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[NumericField]:
    """The numeric fields of ``model`` and its sub-sections. Any annotation this does not
    recognise fails loudly, so a new kind of field cannot slip past the bounds tests."""
    out = []
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        ann = _strip_optional(field.annotation)
        if _is_model(ann):
            out += _walk(ann, path)
        elif ann in (int, float):
            default = field.get_default(call_default_factory=True)
            out.append(NumericField(path, ann, _bounds(field.metadata), False, default))
        elif typing.get_origin(ann) is list:
            (item,) = typing.get_args(ann)
            item_type = typing.get_args(item)[0] if typing.get_origin(item) is typing.Annotated else item
            if typing.get_origin(item_type) is Literal or item_type is str:
                continue  # a list of choices (workflow.tracks) or of names (workflow.families): no bounds
            assert item_type in (int, float), f"{'.'.join(path)}: list of {item_type}"
            out.append(NumericField(path, item_type, _bounds(list(typing.get_args(item)[1:])), True,
                                    field.get_default(call_default_factory=True)))
        elif ann in (bool, str) or typing.get_origin(ann) in (Literal, dict):
            continue
        else:
            raise AssertionError(f"{'.'.join(path)}: unrecognised annotation {field.annotation}")
    return out


FIELDS = _walk(PipelineConfig)
KEYS_TRIED = [f.key for f in FIELDS]  # the dotted keys the bounds walk tries (quoted in reports)
TRAIN_FIELDS = [f for f in FIELDS if f.path[0] == "train"]


def _out_of_range(f: NumericField) -> list[tuple[str, Any]]:
    """(label, value) pairs just outside each bound, plus NaN and +-inf for floats. The label
    says which rule the value breaks: ``0 (ge 1)``, ``1.0 (lt 1)``, ``nan``."""
    eps = 1 if f.kind is int else 1e-3
    cases = []
    for name, bound in f.bounds.items():
        value = f.kind({"ge": bound - eps, "gt": bound, "le": bound + eps, "lt": bound}[name])
        cases.append((f"{value!r} ({name} {bound})", value))
    if f.kind is float:
        cases += [("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf)]
    return cases


def _value(f: NumericField, bad: Any) -> Any:
    return [bad, *f.default[1:]] if f.is_list else bad


def _nest(path: tuple[str, ...], value: Any) -> dict:
    out: Any = value
    for part in reversed(path):
        out = {part: out}
    return out


@pytest.fixture(scope="module")
def schema() -> dict:
    return json_schema()


CASES = [pytest.param(f, label, bad, id=f"{f.key}={label}") for f in FIELDS for label, bad in _out_of_range(f)]


# --------------------------------------------------------------------------- the bounds walk


def test_discovery_finds_the_numeric_keys():
    print(f"\n{len(KEYS_TRIED)} numeric keys: {', '.join(KEYS_TRIED)}")
    assert len(KEYS_TRIED) == len(set(KEYS_TRIED)) >= 50
    assert {"train.val_every", "train.betas", "train.weight_sync.timeout_s", "train.replay.max_age",
            "train.normalize_constant", "ray.num_cpus", "pretrain.seq_len", "data.val_fraction",
            "tokenizer.vocab_size", "workflow.bench_repeats"} <= set(KEYS_TRIED)
    assert not {"train.use_std_normalization", "train.mode", "workflow.run_tests"} & set(KEYS_TRIED)


@pytest.mark.parametrize("f", FIELDS, ids=KEYS_TRIED)
def test_every_numeric_key_has_a_bound(f):
    assert f.bounds, f"{f.key} has no ge/gt/le/lt bound: give its Field a valid range"
    assert {"ge", "gt"} & set(f.bounds), f"{f.key} has no lower bound"


@pytest.mark.parametrize("f", FIELDS, ids=KEYS_TRIED)
def test_defaults_are_in_range(f):
    values = f.default if f.is_list else [f.default]
    for v in values:
        if v is None:
            continue
        assert all({"ge": v >= b, "gt": v > b, "le": v <= b, "lt": v < b}[n] for n, b in f.bounds.items()), f.key


@pytest.mark.parametrize("f, label, bad", CASES)
def test_out_of_range_value_names_the_key(f, label, bad):
    with pytest.raises(ConfigError, match=re.escape(f.key)):
        parse_config(_nest(f.path, _value(f, bad)))


@pytest.mark.parametrize("f", TRAIN_FIELDS, ids=[f.key for f in TRAIN_FIELDS])
def test_out_of_range_variant_override_names_the_variant_key(f):
    _, bad = _out_of_range(f)[0]
    dotted = ".".join(f.path[1:])
    with pytest.raises(ConfigError, match=re.escape(f"variants.v.{dotted}")):
        parse_config({"variants": {"v": {dotted: _value(f, bad)}}})


@pytest.mark.parametrize("f, label, bad", [c for c in CASES if math.isfinite(c.values[2])])
def test_schema_rejects_the_same_values(schema, f, label, bad):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_nest(f.path, _value(f, bad)), schema)


@pytest.mark.parametrize("f", FIELDS, ids=KEYS_TRIED)
def test_schema_carries_the_bounds(schema, f):
    prop = schema
    for part in f.path:
        prop = prop["properties"][part]
    assert prop["description"]
    node = prop["items"] if f.is_list else prop
    node = next(s for s in node.get("anyOf", [node]) if s.get("type") != "null")
    keyword = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    assert {keyword[n]: b for n, b in f.bounds.items()} == {k: node[k] for k in keyword.values() if k in node}
    assert node["type"] == ("integer" if f.kind is int else "number")


# --------------------------------------------------------------------------- types and keys


@pytest.mark.parametrize("data, key, text", [
    ({"train": {"n_grpo_steps": "many"}}, "train.n_grpo_steps", "integer"),
    ({"train": {"n_grpo_steps": "10"}}, "train.n_grpo_steps", "integer"),
    ({"train": {"n_grpo_steps": True}}, "train.n_grpo_steps", "integer"),
    ({"train": {"n_grpo_steps": 10.0}}, "train.n_grpo_steps", "integer"),
    ({"train": {"learning_rate": "1e-3"}}, "train.learning_rate", "number"),
    ({"train": {"learning_rate": False}}, "train.learning_rate", "number"),
    ({"pretrain": {"threads": None}}, "pretrain.threads", "integer"),
    ({"workflow": {"run_tests": "yes"}}, "workflow.run_tests", "boolean"),
    ({"workflow": {"run_tests": 1}}, "workflow.run_tests", "boolean"),
    ({"train": {"betas": [0.9]}}, "train.betas", "must have at least 2 items"),
    ({"train": {"betas": [0.9, 0.95, 0.99]}}, "train.betas", "must have at most 2 items"),
    ({"workflow": {"results_dir": ""}}, "workflow.results_dir", "must not be empty"),
    ({"train": {"betas": [0.9, "x"]}}, "train.betas[1]", "number"),
    ({"train": {"loss_type": "ppo"}}, "train.loss_type", "grpo_clip"),
    ({"pretrain": {"device": "tpu"}}, "pretrain.device", "cuda:N"),
    ({"train": {"device": "cuda:x"}}, "train.device", "cuda:N"),
    ({"train": 3}, "train", "dictionary"),
    ({"variants": {"k2": 5}}, "variants.k2", "dictionary"),
])
def test_wrong_type_names_the_key(data, key, text):
    with pytest.raises(ConfigError, match=re.escape(key)) as err:
        parse_config(data)
    assert text in str(err.value)


@pytest.mark.parametrize("data, message", [
    ({"train": {"val_every": 0}}, "train.val_every: must be >= 1, got 0"),
    ({"train": {"sampling_top_p": 0}}, "train.sampling_top_p: must be > 0, got 0"),
    ({"pretrain": {"min_lr_ratio": 1.5}}, "pretrain.min_lr_ratio: must be <= 1, got 1.5"),
    ({"data": {"val_fraction": 1}}, "data.val_fraction: must be < 1, got 1"),
    ({"train": {"kl_coef": math.nan}}, "train.kl_coef: must be a finite number, got nan"),
])
def test_bound_messages_read_plainly(data, message):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert str(err.value) == message


def test_int_is_accepted_for_a_float_and_devices_parse():
    cfg = parse_config({"train": {"learning_rate": 1, "device": "cuda:1"}, "pretrain": {"device": "cuda"},
                        "workflow": {"gpus_per_colocated": 1, "gpus_per_disaggregated": 2}})
    assert cfg.train.learning_rate == 1.0 and isinstance(cfg.train.learning_rate, float)
    assert (cfg.train.device, cfg.pretrain.device) == ("cuda:1", "cuda")


@pytest.mark.parametrize("data, message", [
    ({"train": {"lerning_rate": 0.1}}, "unknown config key 'train.lerning_rate'; did you mean 'learning_rate'?"),
    ({"trian": {}}, "unknown config key 'trian'; did you mean 'train'?"),
    ({"train": {"weight_sync": {"trnsport": "rdt"}}},
     "unknown config key 'train.weight_sync.trnsport'; did you mean 'transport'?"),
    ({"variants": {"k2": {"mode": "colocated_k", "k": 2, "lerning_rate": 1}}},
     "unknown config key 'variants.k2.lerning_rate'; did you mean 'learning_rate'?"),
    ({"variants": {"d": {"weight_sync.trnsport": "rdt"}}},
     "unknown config key 'variants.d.weight_sync.trnsport'; did you mean 'transport'?"),
])
def test_unknown_key_suggests_the_close_one(data, message):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert str(err.value) == message


def test_unknown_key_without_a_close_match_lists_the_keys():
    with pytest.raises(ConfigError, match=r"unknown config key 'ray\.zzz'; valid keys: address, include_dashboard"):
        parse_config({"ray": {"zzz": 1}})


def test_unknown_key_in_a_table_entry_names_the_entry_s_keys():
    # families.<name> is an entry of a table of sections: its valid keys are FamilyConfig's
    with pytest.raises(ConfigError,
                       match=r"unknown config key 'families\.f\.zzz'; valid keys: track, systems, question, "):
        parse_config({"families": {"f": {"zzz": 1, "variants": {"a": {}}}}})


def test_math_section_defaults_survive_a_partial_section():
    # math.pretrain / math.tokenizer have their own defaults; giving one key must not reset the others
    # to the keyword track's (the default_factory bug: the math model got the keyword track's 700 steps)
    cfg = parse_config({"math": {"pretrain": {"threads": 1}, "tokenizer": {"path": None}}})
    fresh = parse_config({})
    assert cfg.math.pretrain.threads == 1
    assert cfg.math.pretrain.max_steps == fresh.math.pretrain.max_steps != fresh.pretrain.max_steps
    assert cfg.math.pretrain.eval_every == fresh.math.pretrain.eval_every != fresh.pretrain.eval_every
    assert cfg.math.tokenizer.vocab_size == fresh.math.tokenizer.vocab_size != fresh.tokenizer.vocab_size


def test_several_errors_are_all_reported():
    with pytest.raises(ConfigError) as err:
        parse_config({"train": {"val_every": 0, "cliprange": -1}, "data": {"seed": -1}})
    msg = str(err.value)
    assert msg.startswith("3 config errors") and all(k in msg for k in ("train.val_every", "train.cliprange",
                                                                         "data.seed"))


# --------------------------------------------------------------------------- cross-field rules


@pytest.mark.parametrize("train, message", [
    ({"rollout_batch_size": 30}, "train.rollout_batch_size (30) must be divisible by train.group_size (4)"),
    ({"gradient_accumulation_steps": 5},
     "train.train_batch_size (32) must be divisible by train.gradient_accumulation_steps (5)"),
    ({"group_size": 8, "train_batch_size": 4, "rollout_batch_size": 32},
     "train.train_batch_size (4) must be >= train.group_size (8)"),
    ({"train_batch_size": 24}, "train.rollout_batch_size (32) must be divisible by train.train_batch_size (24)"),
    ({"group_size": 8, "train_batch_size": 12, "rollout_batch_size": 48},
     "train.train_batch_size (12) must be divisible by train.group_size (8)"),
    ({"mode": "colocated_k", "k": 3}, "train.n_grpo_steps (100) must be divisible by train.k (3)"),
    ({"k": 2}, "train.k=2 needs train.mode: colocated_k"),
    ({"replay": {"enabled": True}}, "train.replay.enabled needs train.mode: disaggregated"),
    ({"policy_lag": 2}, "train.policy_lag=2 needs train.mode: disaggregated"),
    ({"mode": "disaggregated", "replay": {"enabled": True, "capacity_groups": 4}},
     "train.replay.capacity_groups (4) must hold one rollout batch"),
    ({"sampling_min_tokens": 61}, "train.sampling_min_tokens (61) must be <= train.sampling_max_tokens (60)"),
])
def test_cross_field_rules_name_both_keys(train, message):
    with pytest.raises(ConfigError) as err:
        parse_config({"train": train})
    assert message in str(err.value)


def test_tinystories_needs_corpus_path():
    with pytest.raises(ConfigError, match=r"data\.corpus_path is required"):
        parse_config({"data": {"corpus_source": "tinystories"}})
    assert parse_config({"data": {"corpus_source": "tinystories", "corpus_path": "ts.txt"}}).data.corpus_path


def test_valid_cross_field_combinations_pass():
    cfg = parse_config({"train": {"mode": "disaggregated", "replay": {"enabled": True}},
                        "variants": {"k4": {"mode": "colocated_k", "k": 4, "replay.enabled": False}}})
    assert resolve_variant(cfg, "k4").derived().rounds == 25
    assert cfg.train.derived().total_optimizer_steps == 100


# --------------------------------------------------------------------------- variants


def test_bad_variant_override_names_the_variant_key():
    with pytest.raises(ConfigError, match=r"^variants\.k4\.sampling_top_p: must be <= 1, got 1\.5$"):
        parse_config({"variants": {"k4": {"sampling_top_p": 1.5}}})
    with pytest.raises(ConfigError, match=r"variants\.x\.n_grpo_steps \(100\) must be divisible by variants\.x\.k"):
        parse_config({"variants": {"x": {"mode": "colocated_k", "k": 3}}})
    with pytest.raises(ConfigError, match=r"variants\.d\.weight_sync\.transport: must be 'local', 'object_store' or"):
        parse_config({"variants": {"d": {"weight_sync.transport": "pigeon"}}})
    with pytest.raises(ConfigError, match=r"variants\.d: override 'k\.x'"):
        parse_config({"variants": {"d": {"k.x": 1}}})


def test_null_variant_is_dropped_and_unknown_variant_named():
    cfg = parse_config({"variants": {"a": {"mode": "colocated_sync"}, "b": None}})
    assert list(cfg.variants) == ["a"]
    with pytest.raises(ConfigError, match="unknown variant 'b'; configured variants: a"):
        resolve_variant(cfg, "b")


# --------------------------------------------------------------------------- direct construction


def test_direct_construction_raises_config_error_with_the_section_key():
    with pytest.raises(ConfigError, match=r"^data\.val_fraction: must be < 1, got 1\.5$"):
        DataConfig(val_fraction=1.5)
    with pytest.raises(ConfigError, match=r"^data\.val_fraction: ") as err:
        PipelineConfig(data={"val_fraction": 1.5})
    assert "data.data" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^pretrain\.max_steps: "):
        PretrainConfig(max_steps=0)
    with pytest.raises(ConfigError, match=r"^train\.weight_sync\.backend: "):
        WeightSyncConfig(backend="tcp")
    with pytest.raises(ConfigError, match=r"^train\.k=2 needs train\.mode: colocated_k"):
        TrainConfig(k=2)
    with pytest.raises(ConfigError, match=r"^unknown config key 'pretrain\.max_step'; did you mean 'max_steps'\?"):
        PretrainConfig(max_step=3)


def test_sections_stay_mutable_and_derived_rechecks():
    cfg = PipelineConfig()
    cfg.pretrain.max_steps = 5
    cfg.model.overrides["x"] = 2
    assert cfg.pretrain.max_steps == 5 and PipelineConfig().model.overrides == {}  # defaults are not shared
    cfg.train.group_size = 5
    with pytest.raises(ConfigError, match=r"train\.rollout_batch_size \(32\) must be divisible by train\.group_size"):
        cfg.train.derived()


def test_to_dict_is_plain_data_that_round_trips():
    cfg = parse_config(yaml.safe_load((ROOT / "config/config.yaml").read_text()))
    data = to_dict(cfg)
    again = parse_config(yaml.safe_load(yaml.safe_dump(data)))
    assert again == cfg and to_dict(again) == data


# --------------------------------------------------------------------------- the JSON schema


def _objects(node: Any):
    if isinstance(node, dict):
        yield node
        for key, value in node.items():
            if key == "properties":
                for s in value.values():
                    yield from _objects(s)
            else:
                yield from _objects(value)
    elif isinstance(node, list):
        for v in node:
            yield from _objects(v)


def test_schema_is_draft_2020_12_closed_and_has_no_defaults(schema):
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    nodes = list(_objects(schema))
    assert not [n for n in nodes if "default" in n or "$ref" in n or "$defs" in n]
    sections = [n for n in nodes if "properties" in n]
    # 10 sections + train.math, train.text, math, math.arithmetic, the math track's tokenizer/model/pretrain,
    # logging, a family, a user's track and its tokenizer/model/pretrain, smoke
    assert len(sections) == 24 and all(n["additionalProperties"] is False for n in sections)
    train = schema["properties"]["train"]["properties"]
    assert (train["val_every"]["minimum"], train["sampling_top_p"]["exclusiveMinimum"],
            train["sampling_top_p"]["maximum"]) == (1, 0, 1)
    assert train["betas"]["minItems"] == train["betas"]["maxItems"] == 2
    assert train["device"]["pattern"] and "description" in train["val_every"]


def _merged(*names: str) -> dict:
    merged: dict = {}
    for name in names:
        update_config(merged, yaml.safe_load((ROOT / "config" / name).read_text()))
    merged["variants"] = {k: v for k, v in merged.get("variants", {}).items() if v is not None}
    return merged


@pytest.mark.parametrize("files", [("config.yaml",), ("config.yaml", "gpu.yaml"), ("config.yaml", "smoke.yaml")])
def test_schema_accepts_the_config_files_and_rejects_val_every_0(schema, files):
    data = _merged(*files)
    jsonschema.validate(data, schema)
    bad = copy.deepcopy(data)
    bad["train"]["val_every"] = 0
    with pytest.raises(jsonschema.ValidationError, match="minimum of 1"):
        jsonschema.validate(bad, schema)
