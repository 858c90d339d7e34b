"""The report reads as text: variants as settings, not Python dicts; no panel titled "None vs X";
negative k1 KL estimates explained."""

from __future__ import annotations

import math
import types
from pathlib import Path

import jinja2
import pandas as pd

from rlpipe.analysis import aggregate, figure_kit, kl_text, plots

WORKFLOW_RST = Path(__file__).parents[1] / "workflow" / "report" / "workflow.rst"


def test_front_page_lists_variants_as_settings_not_dicts():
    cfg = {"variants": {"onpolicy": {}, "k2": {"mode": "colocated_k", "k": 2},
                        "replay": {"mode": "disaggregated", "replay": {"enabled": True, "size": 8}}}}
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as snakemake.report renders it
    text = env.from_string(WORKFLOW_RST.read_text()).render(snakemake=types.SimpleNamespace(config=cfg),
                                                           categories={}, files={})
    assert "- **k2**: ``mode: colocated_k``, ``k: 2``\n" in text
    assert "- **replay**: ``mode: disaggregated``, ``replay.enabled: True``, ``replay.size: 8``\n" in text
    assert "- **onpolicy**: the ``train`` section as it is" in text
    assert "{'" not in text and "comparable across variants" not in text


def test_replay_panel_never_titled_none(tmp_path, make_runs, monkeypatch):
    runs = make_runs(tmp_path / "runs", ("onpolicy", "disagg"))  # a disaggregated run, no replay run
    aggregate.main(["--runs", str(runs), "--out", str(tmp_path / "summary")])
    titles: list[str] = []
    save = figure_kit.save  # the @figure wrapper saves through the kit
    monkeypatch.setattr(figure_kit, "save", lambda fig, out: (titles.extend(a.get_title() for a in fig.axes),
                                                          save(fig, out)))
    plots.plot_replay(plots.load_summary(tmp_path / "summary"), tmp_path / "r.png")
    assert "disagg: reward" in titles
    assert not any("None" in t for t in titles)


def test_negative_k1_estimates_are_explained():
    metrics = pd.DataFrame({"variant": ["a", "a", "b"], "kl/ref_log_ratio": [0.01, -0.004, 0.02],
                            "kl/prev_log_ratio": [0.0, 0.001, -0.001]})
    (s,) = kl_text.negative_k1_sentences(metrics)
    assert "as low as -0.004 in 'a', kl/ref_log_ratio" in s and "unbiased but not non-negative" in s
    assert "k3" in s
    assert kl_text.negative_k1_sentences(metrics.assign(**{"kl/ref_log_ratio": 0.01, "kl/prev_log_ratio": 0.0})) == []


def _kl_metrics(kl):
    steps = list(range(len(kl) + 1))
    return pd.DataFrame({"variant": "ref", "step": steps, "kl/ref_log_ratio": [math.nan, *kl],
                         "reward/val_mean": [0.1 + 0.01 * s for s in steps]})


def test_kl_shape_is_named_only_above_the_fit_threshold():
    good = kl_text.kl_section(pd.DataFrame(), _kl_metrics([0.01 * t**2 for t in range(1, 13)]), "ref")
    assert good["numbers"]["shape"] == "quadratic" and "grows closest to quadratic" in good["sentences"][0]
    assert "12 points" in good["sentences"][1] and "indication" not in good["sentences"][1]
    zigzag = [0.02, 0.08, 0.01, 0.09, 0.03, 0.07, 0.02, 0.1, 0.04, 0.06, 0.05, 0.08]
    bad = kl_text.kl_section(pd.DataFrame(), _kl_metrics(zigzag), "ref")
    assert bad["numbers"]["shape"] is None and bad["numbers"]["best_fit"]  # a best fit, but no shape claimed
    assert "no growth shape is claimed" in bad["sentences"][0] and "grows closest" not in bad["sentences"][0]
    few = kl_text.kl_section(pd.DataFrame(), _kl_metrics([0.01 * t**2 for t in range(1, 6)]), "ref")
    assert "5 points; with fewer than 10 points this is an indication, not a finding" in few["sentences"][1]
