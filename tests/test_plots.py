"""Every figure kind of the contract renders a non-blank PNG (HTML for rollouts) from synthetic
summaries, and a panel whose data is missing carries a "no data" note instead of being empty."""

from __future__ import annotations

import json

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from rlpipe import contract
from rlpipe.analysis import aggregate, figure_kit, plots, plots_systems

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def summary_dir(make_runs, tmp_path, variants, mutate=None):
    runs = make_runs(tmp_path / "runs", variants)
    if mutate:
        mutate(runs)
    out = tmp_path / "summary"
    aggregate.main(["--runs", str(runs), "--out", str(out)])
    return out


@pytest.fixture(scope="module")
def full_summary(tmp_path_factory, make_runs):
    return summary_dir(make_runs, tmp_path_factory.mktemp("full"), ("onpolicy", "k2", "disagg"))


def assert_png_not_blank(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000, path
    img = mpimg.imread(path)
    assert np.asarray(img)[..., :3].std() > 0.01  # something was drawn


PNG_KINDS = sorted(k for k, f in contract.FIGURES.items() if f.ext == "png")


def test_kinds_are_the_contract_figures():
    assert set(plots.KINDS) == set(contract.FIGURES)
    assert set(contract.FIGURES) - set(PNG_KINDS) == {"rollouts"}


@pytest.mark.parametrize("kind", PNG_KINDS)
def test_every_kind_renders(full_summary, tmp_path, kind):
    out = tmp_path / contract.figure_file(kind)
    assert plots.main([kind, "--summary", str(full_summary), "--out", str(out)]) == 0
    assert_png_not_blank(out)


def test_complete_data_draws_without_no_data_notes(full_summary, tmp_path):
    s = plots.load_summary(full_summary)
    for kind in ("reward_vs_step", "reward_vs_time", "kl", "phase_breakdown", "phase_steps", "timeline",
                 "throughput", "versions"):
        assert plots.KINDS[kind](s, tmp_path / f"{kind}.png") == [], kind


def test_missing_variants_are_annotated(tmp_path, make_runs):
    s = plots.load_summary(summary_dir(make_runs, tmp_path, ("onpolicy",)))
    notes = plots.plot_timeline(s, tmp_path / "t.png")
    assert any("disaggregated" in n for n in notes)
    assert any("disaggregated" in n for n in plots.plot_versions(s, tmp_path / "v.png"))
    assert any("replay" in n for n in plots.plot_replay(s, tmp_path / "r.png"))
    assert any("benchmark" in n for n in plots.plot_weight_sync(s, tmp_path / "w.png"))
    for name in ("t.png", "v.png", "r.png", "w.png"):
        assert_png_not_blank(tmp_path / name)


def test_nan_columns_are_annotated(tmp_path, make_runs):
    def drop_kl(runs):
        for p in runs.glob("*/metrics.parquet"):
            m = pd.read_parquet(p)
            for c in ("kl/ref_log_ratio", "kl/ref_k3", "kl/prev_log_ratio", "kl/prev_k3"):
                m[c] = np.nan
            m.to_parquet(p, index=False)

    s = plots.load_summary(summary_dir(make_runs, tmp_path, ("onpolicy", "disagg"), drop_kl))
    notes = plots.plot_kl(s, tmp_path / "kl.png")
    assert len(notes) == 2 and all("KL" in n for n in notes)
    assert_png_not_blank(tmp_path / "kl.png")


def test_empty_summary_never_blank(tmp_path):
    s = plots.Summary(*(pd.DataFrame(columns=["variant"]) for _ in range(6)))
    for kind, fn in plots.KINDS.items():
        out = tmp_path / contract.figure_file(kind)
        notes = fn(s, out)
        assert notes, kind
        if contract.FIGURES[kind].ext == "png":
            assert_png_not_blank(out)


def test_rollouts_html_before_after(full_summary, tmp_path):
    out = tmp_path / "rollouts.html"
    assert plots.main(["rollouts", "--summary", str(full_summary), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.index("<h3>onpolicy</h3>") < text.index("<h3>k2</h3>")  # reference first
    assert "before (first logged step)" in text and "after (last step)" in text
    assert "the cat sat" in text
    assert "<td>cat</td>" in text and "[&quot;cat&quot;]" not in text  # keywords as words, not a JSON list


def test_main_requires_summary(tmp_path):
    with pytest.raises(FileNotFoundError, match="runs.parquet"):
        plots.main(["kl", "--summary", str(tmp_path), "--out", str(tmp_path / "x.png")])


def test_plot_functions_leave_no_open_figures(full_summary, tmp_path):
    s = plots.load_summary(full_summary)
    before = len(plots.plt.get_fignums())
    for kind in PNG_KINDS:
        plots.KINDS[kind](s, tmp_path / contract.figure_file(kind))
    assert len(plots.plt.get_fignums()) == before


@pytest.mark.parametrize("device_type,unit", [("gpu", "GPU-hours"), ("cpu", "device-hours")])
def test_throughput_bills_gpu_runs_in_gpu_hours(tmp_path, monkeypatch, device_type, unit, make_runs):
    """run_info's device_type is "gpu" on GPU runs (what the drivers write, contract.DEVICE_GPU)."""
    def set_device(runs):
        for p in runs.glob(f"*/{contract.RUN_INFO_FILE}"):
            p.write_text(json.dumps({**json.loads(p.read_text()), "device_type": device_type}))

    s = plots.load_summary(summary_dir(make_runs, tmp_path, ("onpolicy", "disagg"), set_device))
    titles = []
    bars = plots_systems._bars
    monkeypatch.setattr(plots_systems, "_bars", lambda ax, r, column, title, *a, **k: (titles.append(title),
                                                                               bars(ax, r, column, title, *a, **k)))
    assert plots.plot_throughput(s, tmp_path / "t.png") == []
    assert titles[-1] == f"{unit} (wall x devices)"


BUSY = {"load_avg_start": 3.0, "load_avg_end": 3.1, "cpus": 2, "run_cores": 2.0, "wall_s": 40.0, "own_cpu_s": 70.0,
        "other_cpu_s": 28.0, "other_cpu_frac": 0.35, "contended": True, "note": ""}


def test_throughput_marks_contended_and_unreplicated_bars(tmp_path, make_runs, monkeypatch):
    """The honesty rule in the figure: a single run's bar is marked n=1, a contended one hatched; none
    is left unmarked as if it were a finding (the reference alone has nothing to compare)."""
    def busy_disagg(runs):
        p = runs / "disagg" / contract.RUN_INFO_FILE
        p.write_text(json.dumps({**json.loads(p.read_text()), "conditions": BUSY}))

    s = plots.load_summary(summary_dir(make_runs, tmp_path, ("onpolicy", "k2", "disagg"), busy_disagg))
    assert list(s.runs["variant"]) == ["disagg", "k2", "onpolicy"]
    assert plots.bar_marks(s.runs, "onpolicy") == [plots.MARK_CONTENDED, plots.MARK_UNREPLICATED, ""]
    hatches, texts = [], []
    save = figure_kit.save  # the @figure wrapper saves through the kit
    monkeypatch.setattr(figure_kit, "save", lambda fig, out: (
        hatches.append([[b.get_hatch() for b in ax.patches] for ax in fig.axes]),
        texts.extend(t.get_text() for ax in fig.axes for t in ax.texts), save(fig, out)))
    assert plots.plot_throughput(s, tmp_path / "t.png") == []
    assert hatches[0][1] == ["//", "..", None]  # the speedup panel: disagg (contended), k2 (n=1), reference
    assert "1.60\ncontended" in texts and "1.25\nn=1" in texts and "1.00" in texts
    assert_png_not_blank(tmp_path / "t.png")


def test_reward_vs_time_and_in_run_sync_mark_contended_and_single_runs(tmp_path, make_runs, monkeypatch):
    """The timing figures beside throughput.png follow its marks: in reward-vs-time a contended run's
    line is dashed and labelled [contended], a quiet single run [n=1]; the in-run weight-sync bars
    are hatched the same way. With no contended run, nothing says contended."""
    def busy_disagg(runs):
        p = runs / "disagg" / contract.RUN_INFO_FILE
        p.write_text(json.dumps({**json.loads(p.read_text()), "conditions": BUSY}))

    figs = []
    save = figure_kit.save
    monkeypatch.setattr(figure_kit, "save", lambda fig, out: (figs.append(fig), save(fig, out)))
    for mutate, busy in ((busy_disagg, True), (None, False)):
        s = plots.load_summary(summary_dir(make_runs, tmp_path / str(busy), ("onpolicy", "disagg"), mutate))
        figs.clear()
        plots.plot_reward_vs_time(s, tmp_path / "rt.png")
        lines = {ln.get_label(): ln.get_linestyle() for ln in figs[0].axes[0].lines}
        disagg = "disagg [contended]" if busy else "disagg [n=1]"
        assert lines[disagg] == ("--" if busy else "-") and lines["onpolicy [n=1]"] == "-"
        footer = " ".join(t.get_text() for t in figs[0].texts)
        assert ("contended, indicative only" in footer) is busy and "'n=1': one run" in footer
        figs.clear()
        plots.plot_weight_sync(s, tmp_path / "ws.png")
        left = figs[0].axes[0]
        hatches = [b.get_hatch() for b in left.patches]
        texts = [t.get_text() for t in left.texts]
        assert None not in hatches and ("//" in hatches) is busy, hatches  # every bar is one run: none unmarked
        assert any(t.endswith("\ncontended") for t in texts) is busy and any(t.endswith("\nn=1") for t in texts)
