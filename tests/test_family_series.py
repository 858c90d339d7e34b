"""The family figures' series (rlpipe.analysis.series, rlpipe.analysis.families): runs that log at
different cadences are smoothed over the same number of steps, and every line drawn ends at the
metric's value at its last step, averaged over the smoothing window."""

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from rlpipe import contract
from rlpipe.analysis import families, series
from rlpipe.analysis.family_data import SMOOTH_STEPS, VAL

STEPS = 20
# The kl_drift case: the run with the penalty logs KL every step and sits near 0.126; the run
# without it logs KL every 5th step and ends higher, at 0.163.
PENALTY = {s: 0.10 + 0.0013 * s for s in range(1, STEPS + 1)}  # 0.126 at step 20
NO_PENALTY = {5: 0.02, 10: 0.06, 15: 0.11, 20: 0.163}


def test_window_counts_steps_not_rows():
    pen = series.trailing_mean(list(PENALTY), list(PENALTY.values()), 5)
    nopen = series.trailing_mean(list(NO_PENALTY), list(NO_PENALTY.values()), 5)
    assert pen[-1] == pytest.approx(np.mean([PENALTY[s] for s in range(16, 21)]))
    assert nopen[-1] == pytest.approx(0.163)  # one point in (15, 20]: drawn as logged
    assert nopen[-1] > pen[-1]  # the run without the penalty ends higher, as its metrics do
    # a 5-row window would have averaged steps 5-20 of the sparse run (0.088) and reversed the order
    assert np.mean(list(NO_PENALTY.values())) < pen[-1]


def test_band_aligns_cadences_on_steps_and_averages_seeds():
    fast = series.replicate_frame(list(PENALTY), list(PENALTY.values()))
    sparse = series.replicate_frame([0, 5, 10, 15, 20], [math.nan, *NO_PENALTY.values()])  # NaN dropped
    assert list(sparse["step"]) == [5, 10, 15, 20]
    b = series.band([sparse], 5)
    assert list(b["step"]) == [5, 10, 15, 20] and list(b["mean"]) == pytest.approx(list(NO_PENALTY.values()))
    assert b["half"].isna().all()  # one replicate: no interval
    two = series.band([fast, fast.assign(y=fast["y"] + 0.02)], 5)  # two seeds: the mean is between them
    last = two[two["step"] == 20].iloc[0]
    assert last["mean"] == pytest.approx(series.window_value(fast, 20, 5) + 0.01)
    assert last["half"] > 0


def _metric(variant: str, seed: int, column: str, step: int) -> float:
    """A known, distinct value of every metric: rising in the step, shifted by seed and variant."""
    base = 1.0 + 0.1 * list(contract.HEALTH_COLUMNS).index(column) if column in contract.HEALTH_COLUMNS else 0.2
    return base + 0.01 * step + 0.003 * seed + (0.05 if variant == "sparse" else 0.0) + 0.001 * (step % 3)


def _write_run(d, variant: str, seed: int, every: int):
    """A replicate that logs the health signals every ``every`` steps and validates every 10."""
    d.mkdir(parents=True, exist_ok=True)
    rows = []
    for step in range(STEPS + 1):
        row = {c: math.nan for c in contract.METRIC_COLUMNS}
        row.update(step=step, policy_version=step, wall_time=3.0 * step, samples=8 * step)
        if step % 10 == 0:
            row[VAL] = _metric(variant, seed, VAL, step)
        if step and step % every == 0:
            row.update({c: _metric(variant, seed, c, step) for c in contract.HEALTH_COLUMNS})
        rows.append(row)
    df = pd.DataFrame(rows, columns=list(contract.METRIC_COLUMNS))
    df.astype({c: "int64" for c in contract.METRIC_INT_COLUMNS}).to_parquet(d / contract.METRICS_FILE)
    info = {"variant": variant, "mode": "colocated_sync", "devices": 1, "device_type": "cpu", "wall_time_s": 60.0,
            "total_samples": 160, "total_optimizer_steps": STEPS, "finished": True,
            "config": {"seed": seed, "val_size": 64}}
    (d / contract.RUN_INFO_FILE).write_text(json.dumps(info))


@pytest.fixture
def fam(tmp_path):
    cfg = {"workflow": {"tracks": ["keyword"]},
           "families": {"fam": {"track": "keyword", "question": "Q?", "base": {"n_grpo_steps": STEPS},
                                "replicates": 2, "x": "kl_coef",
                                "variants": {"dense": {}, "sparse": {"kl_coef": 0.05}}}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    runs = []
    for variant, every in (("dense", 1), ("sparse", 5)):
        for seed in range(2):
            d = tmp_path / "runs" / variant / f"seed{seed}"
            _write_run(d, variant, seed, every)
            runs.append((variant, seed, str(d)))
    return families.load_family(str(tmp_path / "c.yaml"), "fam", runs)


def _expected(variant: str, column: str, step: int, every: int, window: int) -> float:
    """The seed mean of the metric over the logged steps in (step - window, step]."""
    logged = [s for s in range(1, step + 1) if s > step - window and s % every == 0]
    return float(np.mean([np.mean([_metric(variant, seed, column, s) for s in logged]) for seed in range(2)]))


def _drawn(monkeypatch, draw, fam, tmp_path) -> dict[str, dict[str, np.ndarray]]:
    """Axis title -> line label -> the (x, y) points handed to matplotlib (the first line under a label)."""
    seen: dict[str, dict[str, np.ndarray]] = {}

    def capture(fig, out):
        for ax in fig.axes:
            lines = seen.setdefault(ax.get_title(), {})
            for ln in ax.get_lines():
                lines.setdefault(ln.get_label(), ln.get_xydata())
    monkeypatch.setattr(families, "save", capture)
    draw(fam, tmp_path / "x.png", [])
    return seen


def test_every_health_line_ends_at_the_metric_over_its_window(fam, tmp_path, monkeypatch):
    """Variants logging at different cadences are all drawn at the steps every variant logged (every
    5th), each at the seed mean of its values logged there (the window then holds one point)."""
    drawn = _drawn(monkeypatch, families.draw_health, fam, tmp_path)
    checked = 0
    for column, title in contract.HEALTH_COLUMNS.items():
        for variant, every in {"dense": 1, "sparse": 5}.items():
            xy = drawn[title][variant]
            assert list(xy[:, 0]) == [s for s in range(1, STEPS + 1) if s % 5 == 0]  # the shared steps
            shared_every = 5  # what the window sees of the dense run: its points at the shared steps
            want = _expected(variant, column, STEPS, max(every, shared_every), SMOOTH_STEPS)
            assert xy[-1, 1] == pytest.approx(want), (column, variant)
            checked += 1
    assert checked == 2 * len(contract.HEALTH_COLUMNS)


def test_one_cadence_is_smoothed_over_the_window_at_every_logged_step(fam, tmp_path, monkeypatch):
    dense_only = dataclasses.replace(fam, variants=["dense"], runs=fam.of("dense"))
    drawn = _drawn(monkeypatch, families.draw_health, dense_only, tmp_path)
    for column, title in contract.HEALTH_COLUMNS.items():
        xy = drawn[title]["dense"]
        assert list(xy[:, 0]) == list(range(1, STEPS + 1))
        assert xy[-1, 1] == pytest.approx(_expected("dense", column, STEPS, 1, SMOOTH_STEPS)), column


def test_a_lower_last_value_is_drawn_lower_whatever_the_other_runs_cadence(fam, tmp_path, monkeypatch):
    """The kl_drift figure's defect: the penalty run (every step) ends below the run without it (every
    5th step) at step 20, but its 5-step mean over steps 16-20 is above. The figure must end the
    penalty run below, as the runs' values at step 20 are."""
    spike = {16: 0.14, 17: 0.29, 18: 0.04, 19: 0.17, 20: 0.106}  # the measured kl005 run
    for r in fam.runs:
        m = r.run.metrics
        if r.variant == "dense":
            m["kl/ref_k3"] = [spike.get(int(s), 0.1) if s else math.nan for s in m["step"]]
        else:
            m["kl/ref_k3"] = [0.115 if s and s % 5 == 0 else math.nan for s in m["step"]]
    drawn = _drawn(monkeypatch, families.draw_health, fam, tmp_path)[contract.HEALTH_COLUMNS["kl/ref_k3"]]
    assert np.mean(list(spike.values())) > 0.115  # a 5-step window over the penalty run would end above
    assert drawn["dense"][-1, 1] == pytest.approx(0.106) and drawn["sparse"][-1, 1] == pytest.approx(0.115)


def test_every_reward_curve_ends_at_the_last_validation(fam, tmp_path, monkeypatch):
    drawn = _drawn(monkeypatch, families.draw_curves, fam, tmp_path)
    by_step = drawn["fam: validation reward"]
    by_time = drawn["vs wall-clock time"]
    for variant in ("dense", "sparse"):
        want = _expected(variant, VAL, STEPS, 10, 1)
        step_line = next(xy for label, xy in by_step.items() if label.startswith(variant + " "))
        assert step_line[-1] == pytest.approx([STEPS, want])
        assert by_time[variant][-1] == pytest.approx([3.0 * STEPS, want])
    sweep = drawn["final reward vs kl_coef"]  # the sweep panel: each variant's final reward at its x
    points = next(iter(sweep.values()))  # errorbar's data line comes first, then its caps
    assert points[:, 0] == pytest.approx([0.0, 0.05])
    assert points[:, 1] == pytest.approx([_expected(v, VAL, STEPS, 10, 1) for v in ("dense", "sparse")])


def test_kl_steepest_growth_averages_over_steps():
    """KL logged every 5th step jumps by 0.5 between steps 20 and 25: a 5-step window holds one
    point, so the slope there is 0.5 / 5 = 0.1 per step (a 5-row window would spread it over 25 steps)."""
    from rlpipe.analysis.kl_text import steepest_growth
    steps = list(range(5, 45, 5))
    df = pd.DataFrame({"step": steps, "kl": [0.0 if s <= 20 else 0.5 for s in steps]})
    step, slope = steepest_growth(df)
    assert step == 25 and slope == pytest.approx(0.1)


def test_kl_answer_states_the_values_it_compares_at_one_step(fam, tmp_path):
    """The kl_drift answer: KL with and without the penalty, both at the last step both logged
    (the sparse run logs every 5th), as the health figure's last points show them."""
    from rlpipe.analysis.expectations import PREFIX_NOT_SHOWN
    numbers = families.build(fam, tmp_path / "out")
    with_, without = (_expected(v, "kl/ref_k3", STEPS, 1, 1) for v in ("sparse", "dense"))
    sentence = next(s for s in numbers["answer"] if "KL to reference (k3)" in s and s.startswith("Expected"))
    # here the penalty run is the higher one, so the penalty's expected effect is not shown
    assert sentence.startswith(PREFIX_NOT_SHOWN)
    assert f"at step 20, sparse (kl_coef 0.05) {with_:.3g} vs dense (kl_coef 0) {without:.3g}" in sentence
    assert numbers["variants"]["sparse"]["settings"]["kl_coef"] == 0.05


def test_kl_family_answer_says_how_fast_kl_grows(fam, tmp_path):
    numbers = families.build(fam, tmp_path / "out")
    first, last = (_expected("dense", "kl/ref_k3", s, 1, 1) for s in (1, STEPS))
    want = (f"KL growth: in dense (seed mean, kl/ref_k3), KL to the reference went from {first:.3g} at step 1 to "
            f"{last:.3g} at step {STEPS}, closest to linear in the step")
    assert any(s.startswith(want) for s in numbers["answer"]), numbers["answer"]
    assert any(s.startswith("KL growth: in sparse") and "from" in s for s in numbers["answer"])
    fam.settings["sparse"]["kl_coef"] = 0.0  # a family that does not vary the penalty says nothing of it
    assert families.kl_sentences(fam) == []


def test_first_and_last_fifth_are_fifths_of_the_steps_whatever_the_cadence():
    """The health numbers the answer quotes cover the first and last fifth of the steps, not of the
    logged rows: a run that logged every step up to 10 and then only at 15 and 20 ends with its
    step-20 value (the last fifth of its 12 rows would have taken steps 15 and 20)."""
    from types import SimpleNamespace

    from rlpipe.analysis.family_data import Family, Replicate, start_end
    steps = [*range(0, 11), 15, 20]
    m = pd.DataFrame({"step": steps, "kl/ref_k3": [0.01 * s for s in steps]})
    fam = Family(name="f", question="q", reference="a", variants=["a"], replicates=1,
                 runs=[Replicate("a", 0, SimpleNamespace(metrics=m), {})])
    first, last = start_end(fam, "a", "kl/ref_k3")
    assert first == pytest.approx(np.mean([0.01 * s for s in (1, 2, 3, 4)]))  # steps <= 1 + 19/5
    assert last == pytest.approx(0.20)  # steps >= 20 - 19/5
