"""What the default target asks for, and what the results page reads, for the tracks and families
this run has (the file names come from the run-output contract, rlpipe.contract)."""

from __future__ import annotations

from collections.abc import Iterable

from rlpipe.config import KEYWORD_TRACK, MATH_TRACK, Track
from rlpipe.contract import (
    FAMILY_REPORT_DIR,
    FAMILY_REPORT_FILES,
    FIGURES,
    MATH_REPORT_FILES,
    SCALING_REPORT_DIR,
    SCALING_REPORT_FILES,
    SUMMARY_FILES,
    SUMMARY_REPORT_FILES,
    TOY_SORT_FILES,
    figure_file,
)
from rlpipe.workflow.layout import Layout, user_timed
from rlpipe.workflow.runs import Runs

#: a user's timed track compares its variants as the keyword track does (tracks.smk: aggregate_track
#: and plot_track_<kind>): its summary, discussion and these figures
TRACK_FIGURES = ("phase_breakdown", "phase_steps", "timeline", "weight_sync")


def track_systems_targets(lay: Layout, t: Track) -> list[str]:
    if not user_timed(t):
        return []
    return [lay.track_res(t.name, "summary", f) for f in (*SUMMARY_FILES.values(), *SUMMARY_REPORT_FILES.values())] + [
        lay.track_res(t.name, "figures", figure_file(k)) for k in TRACK_FIGURES]


def track_targets(lay: Layout, t: Track) -> list[str]:
    targets = [p for v in t.pipeline.variants for p in lay.track_run_outputs(t.name, v).values()]
    if t.evaluate:
        targets += [lay.track_res(t.name, "report", f) for f in MATH_REPORT_FILES.values()]
    return targets + track_systems_targets(lay, t)  # a user's timed track: its systems figures (tracks.smk)


def family_targets(lay: Layout, runs: Runs) -> list[str]:
    """Each family's report, and the runs each family trains itself (not those it shares)."""
    targets = [lay.family_res(f, FAMILY_REPORT_DIR, name) for f in runs.families
               for name in FAMILY_REPORT_FILES.values()]
    targets += [p for f in runs.families for v, s in runs.family_runs(f) if runs.trains_itself(f, v, s)
                for p in lay.family_run_outputs(f, v, s).values()]
    return targets


def all_targets(lay: Layout, runs: Runs, *, toy_sort: bool, bench_names: Iterable[str], scaling: bool) -> list[str]:
    """Everything a full run makes: the results page, every track's and family's outputs, seed 003's
    grid (``toy_sort``), and the keyword track's summary, figures, benchmarks and scaling curves."""
    targets = [lay.res("RESULTS.md")]
    targets += [p for t in lay.tracks.values() for p in track_targets(lay, t)]
    targets += family_targets(lay, runs)
    if toy_sort:
        targets += [lay.res("toy_sort", f) for f in TOY_SORT_FILES.values()]
    if KEYWORD_TRACK not in lay.tracks:
        return targets
    targets += [lay.res("summary", f) for f in SUMMARY_FILES.values()]
    targets += [lay.res("summary", f) for f in SUMMARY_REPORT_FILES.values()]
    targets += [lay.figure_path(k) for k in FIGURES]
    targets += [lay.res("bench", f"{b}.json") for b in bench_names]  # bench.smk: trl only where installed
    targets += [lay.res("base", "zero_shot.json")]
    if scaling:
        targets += [lay.res("bench", SCALING_REPORT_DIR, f) for f in SCALING_REPORT_FILES.values()]
    return targets


def results_page_inputs(lay: Layout, families: Iterable[str], *, toy_sort: bool) -> list[str]:
    """What the results page reads: the summary table, each evaluated track's evaluations and each
    family's table, for the tracks and families this run has."""
    keyword = KEYWORD_TRACK in lay.tracks
    inputs = [lay.res("summary", SUMMARY_FILES["table_csv"])] if keyword else []
    inputs += [lay.track_eval_outputs(t.name, m)["summary"] for t in lay.tracks.values() if t.evaluate
               for m in ["base", *t.pipeline.variants]]
    inputs += [lay.family_res(f, FAMILY_REPORT_DIR, FAMILY_REPORT_FILES["table"]) for f in families]
    # what the answers read beyond the tables (rlpipe.analysis.results_view): the main discussion,
    # the math track's report and seed 003's grid, for the parts this run has
    inputs += [lay.res("summary", SUMMARY_FILES["discussion_json"])] if keyword else []
    inputs += [lay.track_res(MATH_TRACK, "report", MATH_REPORT_FILES["math_json"])] if MATH_TRACK in lay.tracks else []
    inputs += [lay.res("toy_sort", TOY_SORT_FILES["table_csv"])] if toy_sort else []
    return inputs
