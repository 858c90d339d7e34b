"""``rlpipe results-page``: a finished run's answers and headline numbers as Markdown (``RESULTS.md``).

Numbers come from runs, never from typing: this page is the short, shareable companion of the report,
written by the workflow (rule ``write_results_page``) from what a run left in ``results/``:

- the answers to the seed questions, opening the page: the deliverables manifest as a table of
  contents, then each question's computed answer (``rlpipe.analysis.deliverables``);
- the date it was written, and the machine and software the numbers came from: every
  ``run_info.json`` ``provenance`` record under the results directory (CPU model, the CPU capability
  torch used, cores, Python, platform, package versions, the lock's hash; several values are listed
  when runs differ);
- seed 000's systems comparison from ``summary/summary.csv`` (validation reward at step 0 and at the
  end, samples/s, speedup against the reference variant, wall time, whether the run was contended);
- each evaluated track's evaluations (``math/eval/<model>/summary.json`` for the math track,
  ``tracks/<name>/eval/<model>/summary.json`` for a user's track: accuracy, format rate);
- each experiment family's final validation reward, mean and 95% half-width over replicates
  (``families/<family>/report/summary.csv``);
- how long the last complete run of the pipeline took, with the machine's load over it
  (``run_timing.json``, ``rlpipe.analysis.run_timing``: written when a run from the start succeeds,
  so a page shows the run before the one that wrote it).

A part whose files are absent is left out, so the page also works for a run of one track. Not in the
seeds: they have no results page; the docs' Results page includes this file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from rlpipe import contract
from rlpipe.analysis import flat_reward, run_timing
from rlpipe.analysis.deliverables import answers
from rlpipe.analysis.deliverables import render_html as answers_html
from rlpipe.analysis.deliverables import render_markdown as answers_markdown
from rlpipe.analysis.results_view import ResultsView
from rlpipe.io import write_text

PAGE = "RESULTS.md"
MACHINE_FIELDS = (("CPU model", "cpu_model"), ("CPU capability (torch kernels)", "cpu_capability"),
                  ("ATEN_CPU_CAPABILITY", "aten_cpu_capability"), ("CPU cores", "cpus"), ("Python", "python"),
                  ("platform", "platform"), ("lock (requirements/lock.txt sha256)", "lock_sha256"))
SYSTEMS_COLUMNS = (("variant", "variant", "{}"), ("mode", "mode", "{}"),
                   ("val reward (step 0)", "val_reward_initial", "{:.3f}"),
                   ("val reward (final)", "val_reward_final", "{:.3f}"),
                   ("samples/s", "samples_per_s", "{:.2f}"), ("speedup vs reference", "speedup_vs_ref", "{:.2f}x"),
                   ("wall time (s)", "wall_time_s", "{:.1f}"), ("contended", "contended", "{}"))


def _fmt(value: Any, fmt: str = "{}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is unreadable: {e}") from None
    return data if isinstance(data, dict) else {}


def provenance_records(results: Path) -> list[dict]:
    """The ``provenance`` record of every run under ``results`` (runs without one are skipped)."""
    out = []
    for path in sorted(results.rglob(contract.RUN_INFO_FILE)):
        prov = _read_json(path).get("provenance")
        if isinstance(prov, dict):
            out.append(prov)
    return out


def _values(records: list[dict], get) -> str:
    seen = []
    for r in records:
        v = get(r)
        v = "not set" if v is None else str(v)
        if v not in seen:
            seen.append(v)
    return "; ".join(sorted(seen)) if seen else "not recorded"


def machine_section(records: list[dict]) -> list[str]:
    lines = ["## Machine and software", ""]
    if not records:
        return lines + ["The runs recorded no provenance (machine, CPU kernels, package versions).", ""]
    lines += [f"From the provenance of {len(records)} runs; a field lists several values when runs differ.", "",
              "| what | value |", "| --- | --- |"]
    lines += [f"| {label} | {_values(records, lambda r, k=key: r.get(k))} |" for label, key in MACHINE_FIELDS]
    packages = sorted({p for r in records for p in (r.get("versions") or {})})
    lines += [f"| {p} | {_values(records, lambda r, p=p: (r.get('versions') or {}).get(p))} |" for p in packages]
    return lines + [""]


def _table(frame: pd.DataFrame, columns) -> list[str]:
    cols = [(h, c, f) for h, c, f in columns if c in frame.columns]
    lines = ["| " + " | ".join(h for h, _, _ in cols) + " |", "|" + " --- |" * len(cols)]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_fmt(row[c], f) for _, c, f in cols) + " |")
    return lines


def systems_section(results: Path) -> list[str]:
    path = results / "summary" / contract.SUMMARY_FILES["table_csv"]
    if not path.is_file():
        return []
    table = pd.read_csv(path)
    return ["## Seed 000: the systems comparison", "", f"From `{path.relative_to(results.parent)}`: one run "
            "per variant, so every speedup is unreplicated (the `systems` family replicates them).", "",
            *_table(table, SYSTEMS_COLUMNS), ""]


def track_eval_dirs(results: Path) -> list[tuple[str, Path]]:
    """(title, eval directory) of every evaluated track: the math track, then users' tracks by name."""
    dirs = [("The MATH track", results / "math" / "eval")]
    dirs += [(f"Track {d.parent.name}", d) for d in sorted((results / "tracks").glob("*/eval"))]
    return dirs


def math_section(results: Path) -> list[str]:
    lines = []
    for title, eval_dir in track_eval_dirs(results):
        evals = sorted(eval_dir.glob(f"*/{contract.EVAL_FILES['summary']}"))
        if not evals:
            continue
        lines += [f"## {title}", "", "| model | examples | answer accuracy | format rate |",
                  "| --- | --- | --- | --- |"]
        for path in evals:
            s = _read_json(path)
            lines.append(f"| {path.parent.name} | {_fmt(s.get('n'))} | {_fmt(s.get('accuracy'), '{:.3f}')} | "
                         f"{_fmt(s.get('format_rate'), '{:.3f}')} |")
        lines.append("")
    return lines


def families_section(results: Path) -> list[str]:
    name = contract.FAMILY_REPORT_FILES["table"]
    tables = sorted((results / "families").glob(f"*/{contract.FAMILY_REPORT_DIR}/{name}"))
    if not tables:
        return []
    lines = ["## Experiment families", "", "Final validation reward, mean ± 95% half-width over replicates "
             "(one replicate: no interval).", "", "| family | variant | replicates | final val reward | diverged |",
             "| --- | --- | --- | --- | --- |"]
    for path in tables:
        family = path.parent.parent.name
        for _, r in pd.read_csv(path).iterrows():
            ci = r.get("val_reward_final_ci")
            reward = _fmt(r.get("val_reward_final_mean"), "{:.3f}")
            if isinstance(ci, float) and not math.isnan(ci):
                reward += f" ± {ci:.3f}"
            lines.append(f"| {family} | {r['variant']} | {_fmt(r.get('replicates'))} | {reward} | "
                         f"{_fmt(r.get('diverged'))} |")
    return lines + [""]


def timing_section(results: Path) -> list[str]:
    """How long the last complete run took, and that timings need a quiet machine."""
    return ["## Run time", "", run_timing.sentence(run_timing.read(results)) + " Timing answers (speedups, "
            "samples/s, the benchmarks) hold only on a quiet machine: run the pipeline with nothing else busy, "
            "and read each timing's load beside it.", ""]


def render(results: str | Path, date: str | None = None) -> str:
    """The page for the results directory ``results``."""
    results = Path(results)
    if not results.is_dir():
        raise FileNotFoundError(f"--results: {results} is not a directory")
    date = date or dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = ["# Results", "", f"Written {date} by `rlpipe results-page` from `{results}`. The report "
            "(`snakemake --report report.html`) is the full writeup; these are its headline numbers.", ""]
    body = systems_section(results) + math_section(results) + families_section(results)
    body += flat_reward.results_section(results)  # a sentence per flat run
    if not body:
        body = ["No finished run was found under this directory.", ""]
    view = ResultsView.load(results)
    done = answers(view)
    toc = answers_markdown(view, done) if seed_stages_ran(done) else [
        "No stage of the seeds' own experiments ran here (a run of your own tracks only), so the answers to "
        "the seed questions are left out; a default run's page has them.", ""]
    return "\n".join(head + toc + timing_section(results) + machine_section(provenance_records(results)) + body)


def seed_stages_ran(done: list) -> bool:
    """Whether any deliverable of the seeds has something to answer from (not every one 'Not run');
    ``done``: ``deliverables.answers`` of the results."""
    return any(not (text and text[0].startswith("Not run")) for d, text in done if d.figure)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe results-page", description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, type=Path, help="a finished run's results directory")
    ap.add_argument("--out", type=Path, help=f"file to write (default: <results>/{PAGE})")
    ap.add_argument("--date", help="date to print (default: now, UTC)")
    ap.add_argument("--answers-html", type=Path, help="also write the answers to the seed questions as HTML here")
    args = ap.parse_args(argv)
    write_text(args.out or args.results / PAGE, render(args.results, args.date))
    if args.answers_html:
        write_text(args.answers_html, answers_html(ResultsView.load(args.results)))
    return 0
