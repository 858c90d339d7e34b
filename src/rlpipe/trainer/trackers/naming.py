"""A run's names in the trackers, from where the workflow puts it.

The workflow's layout says which track or family a run belongs to (``rlpipe.config.Track.subdir``,
``rlpipe.contract.family_run_dir``), relative to ``workflow.results_dir``:

==========================================  =====================  ==============================
run directory                               group                  name
==========================================  =====================  ==============================
``runs/<variant>``                          ``keyword``            ``keyword/<variant>/seed<s>``
``math/runs/<variant>``                     ``math``               ``math/<variant>/seed<s>``
``tracks/<track>/runs/<variant>``           ``<track>``            ``<track>/<variant>/seed<s>``
``families/<family>/runs/<variant>/seed<s>``  ``families/<family>``  ``families/<family>/<variant>/seed<s>``
==========================================  =====================  ==============================

so that a family's replicates share a group (W&B's group, MLflow's experiment) and each run is one
variant and seed. A run directory elsewhere (``rlpipe train --out`` by hand) is grouped by the
directory that holds it. The seed is the run's ``train.seed`` (a replicate's ``--seed``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlpipe import contract
from rlpipe.config import KEYWORD_TRACK, MATH_TRACK
from rlpipe.trainer.trackers.base import RunSpec


def _group(rel: tuple[str, ...]) -> tuple[str, str | None]:
    """(track or family name, family) from the run directory's parts below the results directory."""
    runs = contract.FAMILY_RUNS_DIR
    if len(rel) == 5 and rel[0] == "families" and rel[2] == runs and rel[4].startswith("seed"):
        return rel[1], rel[1]
    if len(rel) == 2 and rel[0] == "runs":
        return KEYWORD_TRACK, None
    if len(rel) == 3 and rel[:2] == (MATH_TRACK, "runs"):
        return MATH_TRACK, None
    if len(rel) == 4 and rel[0] == "tracks" and rel[2] == "runs":
        return rel[1], None
    return (rel[-2] if len(rel) >= 2 else "runs"), None


def run_spec(run_dir: str | Path, results_dir: str | Path, key: str, variant: str, seed: int,
             config: dict[str, Any]) -> RunSpec:
    """The names of the run in ``run_dir`` (see the module docstring)."""
    run_dir, results_dir = Path(run_dir).resolve(), Path(results_dir).resolve()
    try:
        rel = run_dir.relative_to(results_dir).parts
    except ValueError:
        rel = run_dir.parts[-2:]
    track, family = _group(tuple(rel))
    group = f"families/{family}" if family else track
    return RunSpec(run_dir=run_dir, results_dir=results_dir, key=key, track=track, family=family,
                   variant=variant, seed=seed, group=group, name=f"{group}/{variant}/seed{seed}", config=config)
