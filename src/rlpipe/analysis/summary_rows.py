"""Rows of the summary table as the report's sections read them: a variant's row, the first row
with a property, and whether a run was timed under contention (its run_info ``conditions``,
``rlpipe.trainer.conditions``). Sections pick the runs they compare by what the runs are, not by
name; a timing comparison with a contended run states no conclusion (``contention_caveat``).
"""

from __future__ import annotations

import pandas as pd

from rlpipe.analysis.text_format import fpct, nan


def row_of(table: pd.DataFrame, variant: str) -> dict | None:
    rows = table[table["variant"] == variant] if len(table) else table
    return None if rows is None or not len(rows) else rows.iloc[0].to_dict()


def first_row(table: pd.DataFrame, mask) -> dict | None:
    """The first row where ``mask`` holds: sections pick the runs they compare by what the runs are
    (mode, replay, transport, KL coefficient), not by name."""
    rows = table[mask] if len(table) else table
    return rows.iloc[0].to_dict() if len(rows) else None


def has_columns(table: pd.DataFrame, *cols: str) -> bool:
    return bool(len(table)) and all(c in table.columns for c in cols)


def missing(variant: str) -> str:
    return f"No data: variant '{variant}' is not in this run (not configured, or its run is missing)."


def contended(row: dict | None) -> bool:
    """Whether a summary row's run was timed under contention (False when unrecorded)."""
    v = None if row is None else row.get("contended")
    return v is not None and not nan(v) and bool(v)


def contention_caveat(*rows: dict | None) -> str:
    """'' when no run of a timing comparison was contended, else the clause that says so and
    withholds the conclusion: "measured under contention: other processes took 35% of the CPUs
    during disagg; no conclusion is drawn from this comparison"."""
    hit = [r for r in rows if contended(r)]
    if not hit:
        return ""
    during = " and ".join(
        f"{fpct(r.get('other_cpu_frac')) if not nan(r.get('other_cpu_frac')) else 'part'} of the CPUs during "
        f"{r['variant']}" for r in hit)
    return f"measured under contention: other processes took {during}; no conclusion is drawn from this comparison"
