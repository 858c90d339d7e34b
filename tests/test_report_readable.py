"""The report reads as text: variants as settings, not Python dicts; no panel titled "None vs X";
negative k1 KL estimates explained."""

from __future__ import annotations

import types
from pathlib import Path

import jinja2
import pandas as pd

from rlpipe.analysis import aggregate, kl_text, plots

WORKFLOW_RST = Path(__file__).parents[1] / "workflow" / "report" / "workflow.rst"


def test_front_page_lists_variants_as_settings_not_dicts():
    cfg = {"variants": {"onpolicy": {}, "k2": {"mode": "colocated_k", "k": 2},
                        "replay": {"mode": "disaggregated", "replay": {"enabled": True, "size": 8}}}}
    text = jinja2.Template(WORKFLOW_RST.read_text()).render(snakemake=types.SimpleNamespace(config=cfg))
    assert "- **k2**: mode: colocated_k, k: 2" in text
    assert "- **replay**: mode: disaggregated, replay.enabled: True, replay.size: 8" in text
    assert "- **onpolicy**: the ``train`` section as it is" in text
    assert "{'" not in text and "comparable across variants" not in text


def test_replay_panel_never_titled_none(tmp_path, make_runs, monkeypatch):
    runs = make_runs(tmp_path / "runs", ("onpolicy", "disagg"))  # a disaggregated run, no replay run
    aggregate.main(["--runs", str(runs), "--out", str(tmp_path / "summary")])
    titles: list[str] = []
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, out: (titles.extend(a.get_title() for a in fig.axes),
                                                          save(fig, out)))
    plots.plot_replay(plots.load_summary(tmp_path / "summary"), tmp_path / "r.png")
    assert "disagg (no replay run to compare)" in titles
    assert not any("None" in t for t in titles)


def test_negative_k1_estimates_are_explained():
    metrics = pd.DataFrame({"variant": ["a", "a", "b"], "kl/ref_log_ratio": [0.01, -0.004, 0.02],
                            "kl/prev_log_ratio": [0.0, 0.001, -0.001]})
    (s,) = kl_text.negative_k1_sentences(metrics)
    assert "as low as -0.004 in 'a', kl/ref_log_ratio" in s and "unbiased but not non-negative" in s
    assert "k3" in s
    assert kl_text.negative_k1_sentences(metrics.assign(**{"kl/ref_log_ratio": 0.01, "kl/prev_log_ratio": 0.0})) == []
