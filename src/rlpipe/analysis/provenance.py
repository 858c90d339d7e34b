"""Which machine, CPU kernels and package versions each run came from, and whether they differ.

Reads run_info ``provenance`` (written by ``rlpipe.provenance``; keys in
``contract.PROVENANCE_KEYS``). A seeded run is bit-identical only on the same CPU kernels with the same
package versions, so a comparison between runs that differ in any of ``contract.PROVENANCE_COMPARED``
says so: its difference may be partly the machine's, not the variants'. Not in the seeds (they assume
one machine).
"""

from __future__ import annotations

import pandas as pd

#: Summary-table columns (one per run): ``prov_<what>``; versions of ``PROVENANCE_PACKAGES``.
PROVENANCE_PACKAGES = ("torch", "transformers", "tokenizers", "ray", "snakemake")
PROVENANCE_COLUMNS = ("prov_cpu_capability", "prov_cpu_model", *(f"prov_{p}" for p in PROVENANCE_PACKAGES),
                      "prov_lock")
UNKNOWN = "not recorded"


def provenance_stats(info: dict) -> dict:
    """The run's provenance as summary-table columns (``UNKNOWN`` where its run_info has none)."""
    prov = info.get("provenance") if isinstance(info.get("provenance"), dict) else {}
    versions = prov.get("versions") if isinstance(prov.get("versions"), dict) else {}
    lock = prov.get("lock_sha256")
    capability = prov.get("cpu_capability") or UNKNOWN
    if prov.get("aten_cpu_capability"):
        capability = f"{capability} (ATEN_CPU_CAPABILITY={prov['aten_cpu_capability']})"
    return {"prov_cpu_capability": capability, "prov_cpu_model": prov.get("cpu_model") or UNKNOWN,
            **{f"prov_{p}": versions.get(p) or UNKNOWN for p in PROVENANCE_PACKAGES},
            "prov_lock": lock[:12] if isinstance(lock, str) else (UNKNOWN if not prov else "no lock file")}


def differing(table: pd.DataFrame) -> dict[str, list[str]]:
    """{provenance column: its distinct values} for each column on which the table's runs differ."""
    out = {}
    for c in PROVENANCE_COLUMNS:
        if c in table.columns:
            values = sorted({str(v) for v in table[c]})
            if len(values) > 1:
                out[c] = values
    return out


def provenance_sentences(table: pd.DataFrame, what: str = "runs") -> list[str]:
    """One sentence on what the table's runs share, and one naming every difference."""
    if not len(table) or "prov_cpu_capability" not in table.columns:
        return [f"The {what} recorded no provenance (machine, CPU kernels, package versions)."]
    diff = differing(table)
    same = [c for c in PROVENANCE_COLUMNS if c in table.columns and c not in diff]
    shared = "; ".join(f"{c.removeprefix('prov_').replace('_', ' ')} {table[c].iloc[0]}" for c in same)
    s = [f"All {len(table)} {what} share: {shared}." if same else f"The {len(table)} {what} share no provenance."]
    if diff:
        s.append("They differ in " + "; ".join(f"{c.removeprefix('prov_').replace('_', ' ')} ({', '.join(v)})"
                                               for c, v in diff.items())
                 + ": a seeded result is bit-identical only on the same kernels and versions, so part of any "
                   "difference between these runs may come from the machine, not the variant.")
    else:
        s.append("Seeded runs with this provenance are bit-identical when rerun; on another CPU or lock they "
                 "are statistically equivalent (replicates, config/study.yaml), not identical.")
    return s


def provenance_section(table: pd.DataFrame) -> dict:
    """The report's provenance section (same shape as ``report_text.section``)."""
    diff = differing(table) if len(table) else {}
    return {"id": "provenance", "title": "Provenance: machine, CPU kernels and package versions",
            "sentences": provenance_sentences(table), "numbers": {"differing": sorted(diff)}}
