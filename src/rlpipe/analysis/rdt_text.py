"""The main discussion's weight-sync section (seed 000 Problem 9, seed 002 Problem 12): median
sync latency per transport in the training runs and in the benchmark, the best RDT backend against
the best object-store path, and a CPU verdict with its reason from the measured latencies.

Choices the seeds leave open: latencies are medians (the first sync's warm-up is an outlier); a
latency is set against the in-run memcpy of the same payload (the bench's ``memcpy@<placement>``
rows), the floor any transport on one host pays. A comparison between training runs is between
single runs, stated with ``rlpipe.analysis.findings.single_runs``'s verdict, and draws no
conclusion when one of the runs was contended (``contention_caveat``). Every benchmark ratio
carries the load the bench recorded (``findings.timing_load``) and, when contended, the mark
``findings.INDICATIVE``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import pandas as pd

from rlpipe.analysis.findings import TimingLoad, single_runs
from rlpipe.analysis.summary_rows import contention_caveat, row_of
from rlpipe.analysis.text_format import fnum, fsec, fx, nan, section

MEMCPY_LABEL = "memcpy"  # bench rows of the in-run memcpy bound, "memcpy@cpu" (bench_read.read_bench_weight_sync)


def _transport_groups(sync: pd.DataFrame):
    """(source, description, payload, placement, bytes, {transport: median s}, variants) per
    comparable group: same source, payload and placement (the bench labels runs
    ``transport@placement``); variants are the training runs of a ``run`` group."""
    rows = sync[sync["median_s"].notna()].copy() if len(sync) else sync
    if not len(rows):
        return []
    rows["transport"] = [str(x).split("@")[0] for x in rows["label"]]
    rows["placement"] = [str(x).split("@")[1] if "@" in str(x) else "" for x in rows["label"]]
    payload = rows["payload"].astype(str) if "payload" in rows.columns else ""
    rows["payload"] = payload
    out = []
    for (source, pay, place), g in rows.groupby(["source", "payload", "placement"], sort=False):
        what = "in the training runs" if source == "run" else f"in the benchmark ({pay or 'payload'}"
        what += f", {place})" if source != "run" and place else (")" if source != "run" else "")
        nbytes = g["bytes"].max() if "bytes" in g.columns else math.nan
        variants = [v for v in g["variant"].astype(str).unique() if v] if "variant" in g.columns else []
        out.append((source, what, pay, place, nbytes, g.groupby("transport")["median_s"].median(), variants))
    return out


def _latencies(lat: pd.Series, nbytes: float, bound: float) -> str:
    """``label 50 ms (2.0 GB/s, 0.3 of memcpy), ...; in-run memcpy bound 15 ms (6.7 GB/s)``."""
    def rate(sec) -> list[str]:
        return [f"{fnum(nbytes / sec / 1e9)} GB/s"] if not nan(nbytes) and sec > 0 else []

    def one(label, sec) -> str:
        extra = rate(sec) + ([f"{fnum(bound / sec, 2)} of memcpy"] if not nan(bound) and sec > 0 else [])
        return f"{label} {fsec(sec)}" + (f" ({', '.join(extra)})" if extra else "")
    text = ", ".join(one(k, v) for k, v in lat.items())
    if not nan(bound):
        text += f"; in-run memcpy bound {fsec(bound)}" + (f" ({rate(bound)[0]})" if rate(bound) else "")
    return text


class _Pair(NamedTuple):
    """The best object-store path and the best RDT backend of one CPU bench payload."""

    nbytes: float
    payload: str
    obj: str
    obj_s: float
    rdt: str
    rdt_s: float
    memcpy_s: float


def _cpu_verdict(cpu: list[_Pair], load: TimingLoad) -> list[str]:
    """Which path wins on CPU across the bench's payloads, and why, from the measured latencies,
    with the load the bench recorded (contended: indicative only)."""
    cpu = sorted(cpu, key=lambda c: 0 if nan(c.nbytes) else c.nbytes)
    obj_wins = [c for c in cpu if c.obj_s < c.rdt_s]
    rdt_wins = [c for c in cpu if c not in obj_wins]
    names = lambda cs: ", ".join(c.payload for c in cs)  # noqa: E731 - local formatting helper
    if not rdt_wins:
        ratios = [c.rdt_s / c.obj_s for c in cpu]
        s = [f"On CPU the object store wins at every benchmarked payload ({names(cpu)}): RDT's best latency is "
             f"{fx(min(ratios))} to {fx(max(ratios))} the best object-store path's ({load.clause()})."]
    elif not obj_wins:
        ratios = [c.obj_s / c.rdt_s for c in cpu]
        s = [f"On CPU RDT wins at every benchmarked payload ({names(cpu)}): the best object-store path's latency "
             f"is {fx(min(ratios))} to {fx(max(ratios))} RDT's ({load.clause()})."]
    else:
        s = [f"On CPU the winner depends on the payload: the object store wins at {names(obj_wins)}, RDT at "
             f"{names(rdt_wins)} ({load.clause()})."]
    big, small = cpu[-1], cpu[0]
    if nan(big.memcpy_s):
        return s
    units = (f"At {big.payload} the best object-store path ({big.obj}) costs {fnum(big.obj_s / big.memcpy_s, 2)} "
             f"memcpys of the payload and {big.rdt} {fnum(big.rdt_s / big.memcpy_s, 2)}.")
    if big.obj_s < big.rdt_s:
        why = (" Why: on one host both move the bytes through the same memory, and the shared-memory path copies "
               "them least -- once into shared memory (a fresh object-store object when the sender's task returns, "
               "or the reused buffer of a Ray channel), once from a zero-copy view into the receiver's tensors -- "
               "while RDT over gloo packs the weights, pushes them through a loopback "
               "TCP socket (a copy into and one out of the kernel) into a receive buffer Ray allocates, and "
               "page-faults, for every transfer, unpacks them, and takes more Ray round trips per sync. RDT pays off "
               "where it skips host memory: GPU to GPU (NCCL, CUDA IPC, NIXL).")
    else:
        why = (" Why: RDT sends the tensors straight from the sender's process to the receiver's, without the "
               "object store's serialisation and its copy into shared memory, which outweighs its extra round "
               "trips here.")
    fixed = (f" The smallest payload ({small.payload}) shows the fixed cost per sync: {small.obj} "
             f"{fsec(small.obj_s)}, {small.rdt} {fsec(small.rdt_s)}.") if len(cpu) > 1 else ""
    return s + [units + why + fixed]


def rdt_section(sync: pd.DataFrame, table: pd.DataFrame | None = None, bench_load: TimingLoad | None = None) -> dict:
    """Every group's latencies (with GB/s and fraction of the memcpy bound where known), the best
    RDT backend against the best object-store path per group, and a CPU verdict over the bench.
    A comparison between training runs draws no conclusion when one of them was contended
    (``table``: the summary table holding their conditions); a benchmark comparison carries the
    load the bench recorded (``bench_load``, ``findings.timing_load`` of its JSON)."""
    bench_load = bench_load or TimingLoad(math.nan, 0, None)
    title = "Weight-sync latency: object store vs RDT (seed 000 Problem 9, seed 002 Problem 12)"
    s, nums, cpu = [], {}, []
    for source, what, pay, place, nbytes, by, variants in _transport_groups(sync):
        bound = by.get(MEMCPY_LABEL, math.nan)
        lat = by.drop(MEMCPY_LABEL, errors="ignore")
        if not len(lat):
            continue
        at = f" ({bench_load.clause()})" if source != "run" else ""
        s.append(f"Median sync latency {what}: {_latencies(lat, nbytes, bound)}{at}.")
        rdt = {k: v for k, v in lat.items() if str(k).startswith("rdt")}
        obj = {k: v for k, v in lat.items() if str(k).startswith("object_store")}
        if obj and rdt:
            bo, br = min(obj, key=obj.get), min(rdt, key=rdt.get)
            ratio = obj[bo] / rdt[br]
            (win, lose) = (br, bo) if ratio > 1 else (bo, br)
            caveat = contention_caveat(*(row_of(table, v) for v in variants)) if table is not None else ""
            if caveat:
                s.append(f"{bo} vs {br} {what}: {caveat}.")
                nums[f"contended_{source}"] = True
            else:
                one = (f" ({single_runs(1.0, ratio).clause()})" if source == "run"  # one run per side
                       else f" ({bench_load.clause()})")
                s.append(f"{win} is {fx(ratio if ratio > 1 else 1 / ratio)} faster than {lose} {what}{one}.")
            nums.setdefault(f"rdt_gain_{source}", ratio)
            if source == "bench" and place == "cpu":
                cpu.append(_Pair(nbytes, pay, bo, obj[bo], br, rdt[br], bound))
    if not s:
        return section("rdt", title, [("No data: no weight-sync latency was measured (no disaggregated run "
                                      "and no readable results/bench/weight_sync.json).")])
    if cpu:
        s += _cpu_verdict(cpu, bench_load)
        nums["bench_contended"] = bench_load.contended
        big = max(cpu, key=lambda c: 0 if nan(c.nbytes) else c.nbytes)
        nums["cpu_rdt_over_object_store"] = float(big.rdt_s / big.obj_s)  # at the largest payload; < 1: RDT faster
        nums["cpu_best_fraction_of_memcpy"] = float(big.memcpy_s / min(big.obj_s, big.rdt_s))
    skipped = sync[sync["note"].astype(str) != ""] if len(sync) else sync
    for _, r in skipped.iterrows():
        s.append(f"Benchmark {r['label']} not measured: {r['note']}.")
    return section("rdt", title, s, nums)
