"""The config as the workflow reads it, checked before any job.

Every key is checked before any job, the paths included (rlpipe.config.checks: inputs exist and are
readable, workflow.results_dir is writable), so that no job starts on an input it cannot read. A job
that fails leaves the workflow worse off whatever the job does: Snakemake deletes its outputs before
it starts, and records the failed job's params against them even when the outputs are flagged
update() (which restores the old file: its next run with those params would then take the old output
as theirs). So a bad input is refused here, where nothing has been touched yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from snakemake.exceptions import WorkflowError

from rlpipe.config import (
    ConfigError,
    PipelineConfig,
    load_yaml,
    overlay_list_replacements,
    parse_config,
    resolve_variant,
    to_dict,
    track_pipeline,
)
from rlpipe.config.checks import check_paths, check_trackers
from rlpipe.config.run_command import CONFIG_SUFFIXES

#: the tables whose entries an overlay may switch off with `name: null`
NULLABLE_TABLES = ("variants", "families", "tracks")


def drop_null_entries(config: dict) -> None:
    """An overlay config (`--configfile config/smoke.yaml`) switches a variant of the base table off
    with `name: null`: Snakemake merges config files key by key, so it could not remove a key
    otherwise. Edits Snakemake's ``config`` in place (the schema validation reads it after)."""
    for table in NULLABLE_TABLES:
        config[table] = {k: v for k, v in (config.get(table) or {}).items() if v is not None}


def check_config_files(files: Iterable | None) -> None:
    """A target written after --configfile is read by Snakemake as one more config file; it fails
    before the workflow runs unless it exists and parses (a JSON result does): name it here in one
    line. The safe form, which cannot confuse the two, is `rlpipe run` (rlpipe.config.run_command)."""
    for f in files or ():
        if Path(str(f)).suffix.lower() not in CONFIG_SUFFIXES:
            raise WorkflowError(f"{f}: looks like a target; put targets before --configfile (or use `rlpipe run`)")


def run_trains(cfg: PipelineConfig) -> dict[str, dict[str, Any]]:
    """Every run's resolved train settings by track and variant (their template and reward files are checked)."""
    return {f"{n}/{v}: train": to_dict(resolve_variant(p, v)) for n in cfg.workflow.tracks
            for p in [track_pipeline(cfg, n)] for v in p.variants}


def load_checked(config: dict, *, main: bool = True) -> PipelineConfig:
    """Snakemake's merged ``config`` parsed by rlpipe.config, its paths checked (see the module
    docstring); a bad key or path is a WorkflowError naming it. ``main=False`` (a cluster job's parse,
    whose main process checked the same config whole before submitting it): neither each run's settings
    nor the paths, the parse work that grows with the runs."""
    try:
        cfg = parse_config(config, check_runs=main)
        if main:
            check_paths(cfg, run_trains(cfg))
        check_trackers(cfg)  # a tracker named but not installed: its extra, before any job
    except ConfigError as e:
        raise WorkflowError(f"invalid rlpipe config: {e}") from None
    return cfg


def overlay_warnings(files: Iterable | None) -> list[str]:
    """Snakemake merges --configfile overlays key by key but replaces a list whole: one warning line
    for each overlay that replaces a list another set (e.g. a shrinking overlay placed after the user's)."""
    return [f"rlpipe config: warning: {m}"
            for m in overlay_list_replacements([(str(f), load_yaml(f)) for f in files or ()])]
