"""``rlpipe aggregate`` flags partial runs and diagnoses flat rewards (the "Run health" section of
the discussion, the summary table's columns and a warning on stderr)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import yaml

from rlpipe import contract
from rlpipe.analysis import aggregate


def _set_info(run_dir, **changes):
    p = run_dir / contract.RUN_INFO_FILE
    info = json.loads(p.read_text())
    info.update(changes)
    p.write_text(json.dumps(info))


def _flat_zero_std(run_dir):
    """Rewrite the run's metrics: a flat validation reward and 90% zero-variance groups, with a KL to the
    reference that stays small (a drift would be a competing signal, ranked by strength)."""
    m = pd.read_parquet(run_dir / contract.METRICS_FILE)
    m["reward/val_mean"] = 0.5
    m["reward/zero_std_frac"] = np.where(m["step"] >= 1, 0.9, np.nan)
    m["kl/ref_k3"] = 0.01
    m.to_parquet(run_dir / contract.METRICS_FILE, index=False)
    (run_dir / contract.RUN_CONFIG_FILE).write_text(yaml.safe_dump({"train": {"val_size": 256, "n_grpo_steps": 4}}))


def test_partial_and_flat_runs_are_flagged(tmp_path, make_runs, capsys):
    root = make_runs(tmp_path / "runs", variants=("onpolicy", "k2"))
    _set_info(root / "onpolicy", finished=False, total_optimizer_steps=2)
    (root / "onpolicy" / contract.RUN_CONFIG_FILE).write_text(yaml.safe_dump({"train": {"n_grpo_steps": 4}}))
    _flat_zero_std(root / "k2")
    out = tmp_path / "summary"
    assert aggregate.main(["--runs", str(root), "--out", str(out)]) == 0
    assert "warning: Partial run: onpolicy recorded 2 of 4 optimizer steps" in capsys.readouterr().err
    table = pd.read_csv(out / "summary.csv").set_index("variant")
    assert table.loc["onpolicy", "partial"] and not table.loc["k2", "partial"]
    assert table.loc["onpolicy", "steps_planned"] == 4 and table.loc["onpolicy", "steps_done"] == 2
    assert table.loc["k2", "flat_reward"] == "zero_std"
    disc = json.loads((out / "discussion.json").read_text())
    health = disc["sections"][0]
    assert health["id"] == "run_health"
    text = " ".join(health["sentences"])
    assert "Partial run: onpolicy" in text and "k2" in text and "90% of the groups had identical rewards" in text
    assert "Run health" in (out / "discussion.html").read_text()


def test_a_run_with_fewer_steps_than_planned_is_partial_even_if_finished(tmp_path, make_runs):
    root = make_runs(tmp_path / "runs", variants=("onpolicy",))
    (root / "onpolicy" / contract.RUN_CONFIG_FILE).write_text(yaml.safe_dump({"train": {"n_grpo_steps": 16}}))
    run = aggregate.load_runs(root)[0]
    assert aggregate.completeness(run) == {"steps_done": 4, "steps_planned": 16, "partial": True}


def test_a_run_without_run_info_is_partial(tmp_path, make_runs):
    root = make_runs(tmp_path / "runs", variants=("onpolicy",))
    (root / "onpolicy" / contract.RUN_INFO_FILE).unlink()
    run = aggregate.load_runs(root)[0]
    c = aggregate.completeness(run)
    assert c["partial"] and "no run_info.json" in aggregate.partial_sentence("onpolicy", c, run.info)


def test_complete_rising_runs_get_no_health_section(tmp_path, make_runs):
    root = make_runs(tmp_path / "runs")
    runs = aggregate.load_runs(root)
    assert [aggregate.completeness(r)["partial"] for r in runs] == [False] * 3
    assert aggregate.health_section(runs) is None
