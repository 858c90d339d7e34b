"""Seed 000 Problem 10: the optimisation to build next, its design, and what the runs measured of it.

Each candidate has an Amdahl estimate from the reference run's phase seconds (the rest of the
step unchanged) and, where a variant of this run already implements it, a measurement: the
disaggregated run for overlapping generation with training, the ``colocated_k`` run with k = 4 for
syncing weights every 4th step. The recommendation ranks candidates by the measurement where one
exists and was not contended, else by the estimate; a candidate whose measurement contradicts its
estimate (estimated faster, measured no faster) is not recommended, and the text says so.

Departure from the seeds: the seed asks for one idea with its justification and design; we rank the
candidates the pipeline can estimate and let the run's own numbers pick, so the recommendation
follows the measurements of the machine it ran on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from rlpipe import contract
from rlpipe.analysis.findings import single_runs
from rlpipe.analysis.summary_rows import contended, contention_caveat, first_row, has_columns, missing, row_of
from rlpipe.analysis.text_format import fsec, fx, nan, section
from rlpipe.contract import phase_seconds_column

CONTRADICTS = 1.0  # a measured speedup at or below this contradicts an estimated gain


@dataclass(frozen=True)
class Candidate:
    """One optimisation: its name, its Amdahl saving in seconds from the reference's phase seconds
    (``g`` generate + score, ``u`` update, ``r`` ref log-probs, ``o`` old log-probs, ``w`` weight
    sync, ``t`` wall), the summary row that measures it (None: not built here) and its design."""

    name: str
    saving: Callable[..., float]
    measured_by: Callable[[pd.DataFrame], dict | None]
    design: str


def _disagg(table: pd.DataFrame) -> dict | None:
    if not has_columns(table, "mode"):
        return None
    plain = (table["mode"] == "disaggregated") & ~table.get("replay", pd.Series(False, index=table.index)).astype(bool)
    return first_row(table, plain)


def _k4(table: pd.DataFrame) -> dict | None:
    return first_row(table, (table["mode"] == "colocated_k") & (table["k"] == 4)) if has_columns(table, "mode", "k") \
        else None


CANDIDATES = (
    Candidate("overlap generation with training (disaggregated, one version behind)",
              lambda g, u, r, o, w, t: t - max(g, u + r + o + w) - max(t - g - u - r - o - w, 0.0), _disagg,
              "a Generator and a Learner actor on separate devices, the driver keeping the generator at most one "
              "policy version behind (rlpipe.trainer.drivers, train.mode disaggregated, train.policy_lag), weights "
              "pushed after every optimizer step (rlpipe.trainer.weight_sync)"),
    Candidate("a 2x faster sampler", lambda g, u, r, o, w, t: g / 2, lambda t: None,
              "drop finished rows from the KV-cache batch in rlpipe.lm.sampler so late decoding steps run only live "
              "sequences, and on GPU serve the Generator actor from vLLM behind the same Generation record, so no "
              "driver changes"),
    Candidate("a 2x faster update", lambda g, u, r, o, w, t: u / 2, lambda t: None,
              "fused AdamW and bf16 autocast in rlpipe.rl.train_step on GPU, and responses packed without padding "
              "in rlpipe.rl.logprobs"),
    Candidate("no reference forward pass on most steps", lambda g, u, r, o, w, t: r, lambda t: None,
              "with kl_coef 0 the reference model only monitors drift, so score it every val_every steps instead "
              "of every step (a setting beside kl_monitor in the ReferenceModel actor's call)"),
    Candidate("sync weights every 4th step (k = 4)", lambda g, u, r, o, w, t: 0.75 * w, _k4,
              "the colocated_k driver generates k batches per policy version and syncs once (train.mode "
              "colocated_k, train.k 4)"),
)


def _phase_args(r: dict) -> tuple[float, ...]:
    def sec(*phases: str) -> float:
        return sum(0.0 if nan(r.get(phase_seconds_column(p))) else r[phase_seconds_column(p)] for p in phases)
    return (sec(*contract.GEN_PHASES), sec("update"), sec("ref_logprobs"), sec("old_logprobs"), sec("weight_sync"),
            r["wall_time_s"])


def _measured(c: Candidate, table: pd.DataFrame, base: dict, estimate: float) -> tuple[float, str]:
    """(usable measured speedup or NaN, the sentence on the measurement, '' when not built)."""
    row = c.measured_by(table)
    if row is None:
        return math.nan, ""
    caveat = contention_caveat(row, base)
    if caveat:
        return math.nan, (f"{c.name}: built as '{row['variant']}', but its run was {caveat}; the measurement "
                          "neither confirms nor contradicts the estimate.")
    m = row["speedup_vs_ref"]
    text = (f"{c.name}: built as '{row['variant']}', which measured {fx(m)} the reference's throughput "
            f"({single_runs(1.0, m).clause()}) against an estimate of {fx(estimate)}.")
    if estimate > CONTRADICTS and not nan(m) and m <= CONTRADICTS:
        text += (" The measurement contradicts the estimate: the estimate assumes the rest of the step unchanged, "
                 "while the built version also pays for weight syncs between processes and, on CPU, shares its "
                 "cores with them, so it is not recommended on this machine.")
        return -math.inf, text
    return m, text


def optimization_section(table: pd.DataFrame, ref: str) -> dict:
    """Seed 000 Problem 10 (see the module docstring)."""
    title = "Optimization idea: the next one to build, estimated and measured (seed 000 Problem 10)"
    r = row_of(table, ref)
    if r is None:
        return section("optimization", title, [missing(ref)])
    args = _phase_args(r)
    if nan(args[-1]) or args[-1] <= 0:
        return section("optimization", title, [f"No data: '{ref}' has no wall time."])
    est = {c.name: args[-1] / (args[-1] - max(c.saving(*args), 0.0)) if max(c.saving(*args), 0.0) < args[-1]
           else math.inf for c in CANDIDATES}
    s = [f"From '{ref}' ({fsec(args[-1])}: generation {fsec(args[0])}, update {fsec(args[1])}, reference "
         f"{fsec(args[2])}, old log-probs {fsec(args[3])}, weight sync {fsec(args[4])}), each candidate's estimated "
         "speedup (Amdahl: the rest unchanged): " + "; ".join(f"{n} {fx(x)}" for n, x in est.items()) + "."]
    score, nums = dict(est), {}
    for i, c in enumerate(CANDIDATES):
        m, text = _measured(c, table, r, est[c.name])
        nums[f"speedup_{i}"], nums[f"measured_{i}"] = est[c.name], None if nan(m) or math.isinf(m) else m
        if text:
            s.append(text)
            score[c.name] = est[c.name] if nan(m) else m
    best = max(CANDIDATES, key=lambda c: score[c.name])
    basis = "measured" if nums[f"measured_{CANDIDATES.index(best)}"] is not None else "estimated"
    s.append(f"Recommended next: {best.name}, the largest {basis} speedup ({fx(score[best.name])}). Design: "
             f"{best.design}.")
    if contended(r):
        s.append(f"'{ref}' was timed under contention, so these estimates inherit its skew.")
    return section("optimization", title, s, {"recommended": best.name, "basis": basis, **nums})
