"""What a rule's params hold, and the small rules of a job that are no file: canonical JSON (params
compare as text), a section's identity (an operational key reruns nothing), whether this invocation
forces a job, and wildcard constraints that match exactly a set of names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from rlpipe.config import to_dict
from rlpipe.config.identity import identity


def canonical(value: Any) -> str:
    """Parsed config values as canonical JSON: params compare as text, so key order must not count."""
    return json.dumps(value, sort_keys=True, default=str)


def ident(section: Any, key: str) -> dict:
    """A config section's identity (rlpipe.config.identity): what a params value holds, so that an
    operational key (a timeout, a thread count, a logging interval) reruns nothing, and a file a key
    names counts by its content, not its absolute path (a moved project reruns nothing)."""
    return identity(to_dict(section), key)


def section_params(cfg: Any, *sections: str) -> str:
    """The config sections a stage depends on (a params value: a change of an identity key reruns the stage)."""
    return canonical({s: ident(getattr(cfg, s), s) for s in sections})


def forced(dag_settings: Any, rule: str, outputs: Iterable) -> bool:
    """Whether this invocation forces the job (--forcerun RULE or one of its outputs, -f on its
    outputs, -F), from Snakemake's ``workflow.dag_settings``. Training reads it as a resource,
    because resources are no rerun trigger."""
    ds = dag_settings
    targets = {str(t) for t in getattr(ds, "targets", ()) or ()}
    outs = {str(o) for o in outputs}
    return bool(ds.forceall or rule in ds.forcerun or outs & {str(f) for f in ds.forcerun}
                or (ds.forcetargets and outs & targets))


def names_constraint(names: Iterable[str]) -> str:
    """A wildcard constraint matching exactly these names ('(?!)', which never matches: none)."""
    return "|".join(sorted(re.escape(n) for n in set(names))) or "(?!)"


def optional_file(path: str | None) -> list:
    """A path key as an input list: empty when the key is unset."""
    return [path] if path else []


def scaling_settings(cfg: Any) -> str:
    """What a scaling point runs: the train section and the sweep (a change reruns the bench)."""
    w = cfg.workflow
    return canonical({"train": ident(cfg.train, "train"), "sizes": w.scaling_sizes, "batches": w.scaling_batches,
                      "lengths": w.scaling_lengths, "steps": w.scaling_steps})
