"""How long the whole pipeline took: the record a complete ``snakemake`` run leaves in
``results/RUN_TIMING_FILE`` and the sentence that states it (the results page's "Run time" section,
the console's expectation when the next run starts).

The workflow (``workflow/rules/setup.smk``) samples the machine when it is parsed and again when it
succeeds (``rlpipe.trainer.conditions``: the CPU time of Snakemake's own process tree against the
machine's, the same measure every training run records), and writes the record only for a complete
run: one that ran the test gate or a pretraining *and* every training job of its targets, i.e. the
pipeline from its start. A contended record is marked by the report's one rule
(``rlpipe.analysis.findings``); a timing is only an answer on a quiet machine. Not in the seeds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rlpipe.analysis.findings import INDICATIVE

RUN_TIMING_FILE = "run_timing.json"
#: Rules whose presence marks a run that started the pipeline from its beginning.
START_RULES = ("run_unit_tests", "pretrain_base")


def is_complete(rules: dict[str, int]) -> bool:
    """Whether an invocation that ran ``rules`` ({rule: jobs}) ran the pipeline from its start:
    the test gate or a pretraining, and at least one training job."""
    return any(rules.get(r) for r in START_RULES) and bool(rules.get("train_variant"))


def record(wall_s: float, rules: dict[str, int], cores: int | None, conditions: dict, config: str,
           finished: str) -> dict:
    return {"wall_s": round(float(wall_s), 1), "jobs": int(sum(rules.values())), "rules": dict(sorted(rules.items())),
            "cores": cores, "conditions": conditions, "config": config, "finished": finished}


def read(results: str | Path) -> dict | None:
    """The last complete run's record under ``results`` (None when there is none or it is unreadable)."""
    try:
        data = json.loads((Path(results) / RUN_TIMING_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "wall_s" in data else None


def duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600} h {s // 60 % 60} min" if s >= 3600 else f"{s // 60} min {s % 60} s"


def sentence(rec: dict | None) -> str:
    """'The last complete run here (78 jobs, finished 2026-11-26 16:50 UTC) took 46 min 15 s with
    --cores 2 on 2 CPUs; other processes took 61% of the machine meanwhile: contended, indicative only.'"""
    if not rec:
        return ("No complete run of this pipeline has been timed here yet: the first one that runs from the "
                f"start records its duration in results/{RUN_TIMING_FILE}.")
    c = rec.get("conditions") or {}
    frac = c.get("other_cpu_frac")
    busy = ("not measured" if frac is None or (isinstance(frac, float) and math.isnan(frac))
            else f"{100 * frac:.0f}% of the machine")
    cpus = f" on {c['cpus']} CPUs" if c.get("cpus") else ""
    flag = f": {INDICATIVE}" if c.get("contended") else ("" if c.get("contended") is False else ": load unmeasured")
    # under a cluster executor the jobs ran elsewhere: no --cores, and this machine's load is not theirs
    where = (f"with --cores {rec['cores']}{cpus}" if rec.get("cores") is not None
             else f"under a cluster executor (jobs elsewhere; this machine{cpus})")
    return (f"The last complete run here ({rec.get('jobs')} jobs, finished {rec.get('finished')}) took "
            f"{duration(rec['wall_s'])} {where}; other processes took {busy} meanwhile{flag}.")
