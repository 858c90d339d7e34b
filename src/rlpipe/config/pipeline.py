"""Loading and deriving pipeline configs: YAML and overrides, each track's and each family's own
pipeline, the workflow's track records, variants and their GPUs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from rlpipe.config.base import ConfigError, from_dict, to_dict
from rlpipe.config.checks import check_model_overrides, check_one_gpu_nccl
from rlpipe.config.root import PipelineConfig
from rlpipe.config.sections import KEYWORD_TRACK, MATH_TRACK, SYSTEMS_TRACK
from rlpipe.config.smoke import shrink_pipeline, smoke_train
from rlpipe.config.tracks import RESERVED_TRACKS, USER_TRACK_DIR, FamilyConfig, Track
from rlpipe.config.train import TrainConfig


def _set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            raise ConfigError(f"override '{dotted}': '{p}' is not a section")
    d[parts[-1]] = value


def plain_copy(data: Any) -> Any:
    """A deep copy of plain data (dicts, lists, scalars) with every mapping's keys sorted, as the YAML
    round trip this replaces gave it (``yaml.safe_dump`` sorts keys where they compare), at a hundredth
    of its cost: the workflow resolves every run's settings through ``apply_overrides`` at each parse."""
    if isinstance(data, dict):
        try:
            keys = sorted(data)
        except TypeError:
            keys = list(data)
        return {k: plain_copy(data[k]) for k in keys}
    if isinstance(data, list | tuple):
        return [plain_copy(v) for v in data]
    return data


def apply_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overrides`` (nested dicts or dotted keys) into a copy of ``base``."""
    out = plain_copy(base)  # deep copy of plain data
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and "." not in key:
            out[key] = apply_overrides(out[key], value)
        else:
            _set_dotted(out, key, value)
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    return data


def parse_config(data: dict[str, Any], *, check_runs: bool = True) -> PipelineConfig:
    """Validate a whole pipeline config, including every variant's resolved train section.
    A variant set to ``null`` (e.g. by an overlay config) is removed. ``check_runs=False`` leaves out
    what grows with the runs (each variant, track and family resolved and checked): a workflow's
    cluster job parses a config its main process has checked whole, and resolves only its own run."""
    if not isinstance(data, dict):
        raise ConfigError(f"the config must be a mapping, got {type(data).__name__}")
    if isinstance(data.get("variants"), dict):
        data = dict(data, variants={k: v for k, v in data["variants"].items() if v is not None})
    for table in ("families", "tracks"):
        if isinstance(data.get(table), dict):
            data = dict(data, **{table: {k: v for k, v in data[table].items() if v is not None}})
    cfg = from_dict(PipelineConfig, data)
    if cfg.smoke.enabled:  # every track's pretraining, evaluation and families (trains: resolve_variant)
        cfg = from_dict(PipelineConfig, shrink_pipeline(to_dict(cfg), cfg.smoke))
    check_model_overrides(cfg)
    _check_names(cfg)
    _check_tracks(cfg)
    check_one_gpu_nccl("train", cfg.train, cfg.workflow.gpus_per_disaggregated)
    if not check_runs:
        return cfg
    for name in cfg.variants:
        check_one_gpu_nccl(f"variants.{name}", resolve_variant(cfg, name), cfg.workflow.gpus_per_disaggregated)
    for name in cfg.workflow.tracks:
        if name != KEYWORD_TRACK:
            track_pipeline(cfg, name)
    for name in active_families(cfg):
        family_pipeline(cfg, name)
    return cfg


MATH_PREFIX = "math"
#: Variant and family names become directory names and Snakemake wildcard values.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def _check_names(cfg: PipelineConfig) -> None:
    tables = {"variants": cfg.variants, "math.variants": cfg.math.variants, "families": cfg.families,
              "tracks": cfg.tracks}
    tables.update({f"families.{k}.variants": f.variants or {} for k, f in cfg.families.items() if f is not None})
    tables.update({f"tracks.{k}.variants": t.variants for k, t in cfg.tracks.items() if t is not None})
    for where, table in tables.items():
        for name in table:
            if not NAME_PATTERN.fullmatch(name):
                raise ConfigError(f"{where}: name '{name}' must be letters, digits, '_' or '-' (it names a "
                                  "directory and a workflow wildcard)")


def _check_tracks(cfg: PipelineConfig) -> None:
    """Track names: a user's does not shadow a built-in one; workflow.tracks and every family's track
    name a known track."""
    for name in cfg.tracks:
        if name in RESERVED_TRACKS:
            raise ConfigError(f"tracks.{name}: '{name}' is a built-in track name; choose another")
    known = [KEYWORD_TRACK, MATH_TRACK, *cfg.tracks]
    for name in cfg.workflow.tracks:
        if name not in known:
            raise ConfigError(f"workflow.tracks: unknown track '{name}'; known tracks: {', '.join(known)}")
    for f, fam in cfg.families.items():
        if fam is not None and fam.base_track not in known:
            raise ConfigError(f"families.{f}.track: unknown track '{fam.track}'; known tracks: "
                              f"{', '.join([*known, SYSTEMS_TRACK])}")


def track_pipeline(cfg: PipelineConfig, name: str, *, check_runs: bool = True) -> PipelineConfig:
    """Track ``name`` as a pipeline config of its own, on which every stage command runs unchanged:
    ``cfg`` itself for keyword, ``math_pipeline`` for math, ``user_track_pipeline`` for a user's.
    ``check_runs=False``: its variants are not each resolved (``parse_config``)."""
    if name == KEYWORD_TRACK:
        return cfg
    if name == MATH_TRACK:
        return math_pipeline(cfg, check_runs=check_runs)
    return user_track_pipeline(cfg, name, check_runs=check_runs)


def user_track_pipeline(cfg: PipelineConfig, name: str, *, check_runs: bool = True) -> PipelineConfig:
    """A user's track (``tracks.<name>``): its tokenizer/model/pretrain sections in place of the
    keyword track's, ``train`` = the shared train section + its train overrides, ``variants`` = its
    variants. Errors name the ``tracks.<name>.*`` key."""
    if cfg.tracks.get(name) is None:
        raise ConfigError(f"unknown track '{name}'; tracks table: {', '.join(cfg.tracks) or '(empty)'}")
    t, prefix = cfg.tracks[name], f"tracks.{name}"
    try:
        train = apply_overrides(to_dict(cfg.train), dict(t.train))
    except ConfigError as e:
        raise ConfigError(f"{prefix}.train: {e}") from None
    train = smoke_train(train, cfg.smoke)
    from_dict(TrainConfig, train, f"{prefix}.train")
    data = dict(to_dict(cfg), tokenizer=to_dict(t.tokenizer), model=to_dict(t.model), pretrain=to_dict(t.pretrain),
                train=train, variants={k: v or {} for k, v in t.variants.items() if v is not None}, families={})
    data["workflow"] = dict(data["workflow"], families=None)
    return _derived_pipeline(data, prefix, check_runs)


def workflow_tracks(cfg: PipelineConfig, *, check_runs: bool = True) -> dict[str, Track]:
    """Every track in ``workflow.tracks`` as one ``Track`` record, in that order (the workflow's
    single source of paths and inputs)."""
    return {name: _track_record(cfg, name, check_runs) for name in cfg.workflow.tracks}


def _track_record(cfg: PipelineConfig, name: str, check_runs: bool = True) -> Track:
    pipeline = track_pipeline(cfg, name, check_runs=check_runs)
    if name == KEYWORD_TRACK:
        return Track(name, "", pipeline, data_subdir="data/keywords", dataset_dir=None, dataset_command=None,
                     base_model=None, pretrains=cfg.model.base_checkpoint is None, timed=True, evaluate=False,
                     eval_size=None, eval_max_tokens=None)
    if name == MATH_TRACK:
        m = cfg.math
        return Track(name, "math/", pipeline, data_subdir="data", dataset_dir=m.dataset_dir, dataset_command=None,
                     base_model=m.base_model_dir, pretrains=m.base_model_dir is None, timed=False, evaluate=True,
                     eval_size=m.eval_size, eval_max_tokens=m.eval_max_tokens)
    t = cfg.tracks[name]
    return Track(name, f"{USER_TRACK_DIR}/{name}/", pipeline, data_subdir="data", dataset_dir=t.dataset_dir,
                 dataset_command=t.dataset_command, base_model=t.base_model, pretrains=t.base_model is None,
                 timed=t.timed, evaluate=t.evaluate, eval_size=t.eval_size, eval_max_tokens=t.eval_max_tokens)


def math_pipeline(cfg: PipelineConfig, *, check_runs: bool = True) -> PipelineConfig:
    """The MATH track as a pipeline config of its own: ``math.tokenizer``/``model``/``pretrain`` in
    place of the keyword track's, ``train`` = the shared train section + ``math.train`` + ``task:
    math``, ``variants`` = ``math.variants`` (null entries dropped). Every stage command then runs on
    it unchanged. Errors name the ``math.*`` key."""
    m = cfg.math
    try:
        train = apply_overrides(to_dict(cfg.train), dict(m.train))
    except ConfigError as e:
        raise ConfigError(f"{MATH_PREFIX}.train: {e}") from None
    train = smoke_train(train, cfg.smoke)
    train["task"] = "math"
    from_dict(TrainConfig, train, f"{MATH_PREFIX}.train")
    data = dict(to_dict(cfg), tokenizer=to_dict(m.tokenizer), model=to_dict(m.model),
                pretrain=to_dict(m.pretrain), train=train,
                variants={k: v or {} for k, v in m.variants.items() if v is not None})
    return _derived_pipeline(data, MATH_PREFIX, check_runs)


def _derived_pipeline(data: dict[str, Any], prefix: str, check_runs: bool = True) -> PipelineConfig:
    """Validate a pipeline config derived from the user's (the math track's, a family's) and every
    variant it holds (unless ``check_runs`` is False); a variant's error names the key the user wrote
    (``<prefix>.variants.<v>``)."""
    out = from_dict(PipelineConfig, data)
    for name in out.variants if check_runs else ():
        try:
            resolve_variant(out, name)
        except ConfigError as e:
            raise ConfigError(re.sub(r"(?<![\w.])variants\.", f"{prefix}.variants.", str(e))) from None
    return out


FAMILIES_PREFIX = "families"


def active_families(cfg: PipelineConfig) -> list[str]:
    """The families to run: those selected by ``workflow.families`` (all when null) whose track is
    switched on (``workflow.tracks``), in config order; a 'systems' family only while the variants
    table has a variant (selecting it by name with an empty table is an error)."""
    chosen = cfg.workflow.families
    if chosen is not None:
        unknown = [f for f in chosen if f not in cfg.families or cfg.families[f] is None]
        if unknown:
            raise ConfigError(f"workflow.families: unknown family '{unknown[0]}'; configured families: "
                              f"{', '.join(k for k, f in cfg.families.items() if f is not None) or '(none)'}")
        empty = [f for f in chosen if cfg.families[f].is_systems and _track_on(cfg, cfg.families[f].base_track)
                 and not track_pipeline(cfg, cfg.families[f].base_track).variants]
        if empty:
            raise ConfigError(f"workflow.families: '{empty[0]}' is a systems family, but its track's variants "
                              "table is empty (drop it from workflow.families, or set families." + empty[0] + ": null)")

    def on(f: FamilyConfig) -> bool:  # a systems family with no variants table has nothing to compare
        return _track_on(cfg, f.base_track) and (not f.is_systems or bool(track_pipeline(cfg, f.base_track).variants))

    return [k for k, f in cfg.families.items() if f is not None and on(f) and (chosen is None or k in chosen)]


def _track_on(cfg: PipelineConfig, track: str) -> bool:
    return track in cfg.workflow.tracks


def family_base_track(fam: FamilyConfig) -> str:
    """The track whose base model, dataset and train settings family ``fam`` starts from."""
    return fam.base_track


def table_reference(cfg: PipelineConfig) -> str:
    """The variants table's baseline for speedups: ``onpolicy`` if configured, else the first
    colocated_sync variant, else the first."""
    if "onpolicy" in cfg.variants:
        return "onpolicy"
    sync = [v for v in cfg.variants if resolve_variant(cfg, v).mode == "colocated_sync"]
    return (sync or list(cfg.variants) or ["onpolicy"])[0]


def family_pipeline(cfg: PipelineConfig, name: str, *, check_runs: bool = True) -> PipelineConfig:
    """Family ``name`` as a pipeline config of its own: its track's pipeline (``track_pipeline``)
    with ``train`` = that track's train settings + ``families.<name>.base`` and ``variants`` = the
    family's variants (null entries dropped; for a systems family, the track's variants table).
    ``rlpipe train --variant V --seed S`` then runs one replicate unchanged. Errors name the
    ``families.<name>.*`` key."""
    if name not in cfg.families or cfg.families[name] is None:
        raise ConfigError(f"unknown family '{name}'; configured families: {', '.join(cfg.families) or '(none)'}")
    fam, prefix = cfg.families[name], f"{FAMILIES_PREFIX}.{name}"
    track = track_pipeline(cfg, fam.base_track, check_runs=check_runs)
    if fam.is_systems:
        variants = dict(track.variants)
        if not variants:
            raise ConfigError(f"{prefix}: a systems family needs its track's variants table, which is empty")
        if fam.reference is not None and fam.reference not in variants:
            raise ConfigError(f"{prefix}.reference: '{fam.reference}' is not in track {fam.base_track}'s variants "
                              f"table ({', '.join(variants)})")
    else:
        variants = {k: v or {} for k, v in fam.variants.items() if v is not None}
    try:
        train = apply_overrides(to_dict(track.train), fam.base)
    except ConfigError as e:
        raise ConfigError(f"{prefix}.base: {e}") from None
    train = smoke_train(train, cfg.smoke)
    from_dict(TrainConfig, train, f"{prefix}.base")
    data = dict(to_dict(track), train=train, families={}, variants=variants)
    data["workflow"] = dict(data["workflow"], families=None)  # the derived config holds no families
    return _derived_pipeline(data, prefix, check_runs)


def family_reference(cfg: PipelineConfig, name: str) -> str:
    """The variant family ``name`` compares every other one against."""
    fam = cfg.families[name]
    if fam.is_systems:
        return fam.reference or table_reference(track_pipeline(cfg, fam.base_track))
    return fam.reference or next(k for k, v in fam.variants.items() if v is not None)


def family_seeds(cfg: PipelineConfig, name: str) -> list[int]:
    """Replicate seeds of family ``name``: its resolved train.seed, then the next ``replicates - 1``."""
    first = family_pipeline(cfg, name).train.seed
    return [first + i for i in range(cfg.families[name].replicates)]


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    data = load_yaml(path)
    if overrides:
        data = apply_overrides(data, overrides)
    try:
        return parse_config(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def resolve_variant(cfg: PipelineConfig, name: str) -> TrainConfig:
    """The train config of variant ``name``: base ``train`` plus the variant's overrides."""
    if name not in cfg.variants:
        raise ConfigError(f"unknown variant '{name}'; configured variants: {', '.join(cfg.variants) or '(none)'}")
    try:
        merged = apply_overrides(to_dict(cfg.train), cfg.variants[name] or {})
    except ConfigError as e:
        raise ConfigError(f"variants.{name}: {e}") from None
    # smoke: the caps apply to the merged section before it is checked, since a variant's own keys
    # (its k) must hold against the steps it inherits from the shrunk shared section
    merged = smoke_train(merged, cfg.smoke, f"variants.{name}")
    return from_dict(TrainConfig, merged, f"variants.{name}")


#: the train settings ``rlpipe eval-base`` samples with; its Snakemake rule depends on these alone
EVAL_BASE_TRAIN_KEYS = ("sampling_temperature", "sampling_max_tokens", "val_seed")


def eval_base_settings(cfg: PipelineConfig) -> dict[str, Any]:
    """The ``train`` settings the base model's zero-shot evaluation reads (and nothing else of the
    section: an edit of another train key must not rerun it)."""
    return {k: getattr(cfg.train, k) for k in EVAL_BASE_TRAIN_KEYS}


def variant_gpus(cfg: PipelineConfig, name: str) -> int:
    """GPUs a variant's Snakemake job declares: colocated -> 1 device, disaggregated -> 2."""
    mode = resolve_variant(cfg, name).mode
    w = cfg.workflow
    return w.gpus_per_disaggregated if mode == "disaggregated" else w.gpus_per_colocated


def variant_nodes(cfg: PipelineConfig, name: str) -> int:
    """Nodes a variant's job spans: ``workflow.nodes_per_disaggregated`` for a disaggregated one (its
    learner and generator on different nodes), 1 for a colocated one (a single actor)."""
    mode = resolve_variant(cfg, name).mode
    return cfg.workflow.nodes_per_disaggregated if mode == "disaggregated" else 1
