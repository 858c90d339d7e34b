"""Seed 003's toy-sorting grid (rlpipe toy-sort, rlpipe toy-sort-report) end to end on few epochs."""

import pandas as pd
import pytest

from rlpipe import contract
from rlpipe.analysis import toy_sort
from rlpipe.tasks.sorting import experiment


def test_grid_runs_every_cell_and_the_report_marks_the_best(tmp_path):
    curves_path, finals_path = tmp_path / "curves.parquet", tmp_path / "finals.parquet"
    assert experiment.main(["--seeds", "5", "6", "--epochs", "3", "--curves", str(curves_path),
                            "--finals", str(finals_path)]) == 0
    finals = pd.read_parquet(finals_path)
    assert len(finals) == len(experiment.cells()) * 2 == 26
    assert finals["expected_reward"].between(0, 5).all()
    assert len(pd.read_parquet(curves_path)) == 26 * 3
    for key, name in contract.TOY_SORT_DATA.items():
        (tmp_path / name).write_bytes({"curves": curves_path, "finals": finals_path}[key].read_bytes())
    assert toy_sort.main(["--dir", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / contract.TOY_SORT_FILES["table_csv"])
    best = table.loc[table["final_mean"].idxmax()]
    assert best["vs_best"] == 0 and not best["below_best"] and (table["seeds"] == 2).all()
    assert (tmp_path / contract.TOY_SORT_FILES["curves"]).stat().st_size > 0
    assert "Best:" in (tmp_path / contract.TOY_SORT_FILES["table_html"]).read_text()


def test_summary_flags_a_cell_clearly_below_the_best():
    finals = pd.DataFrame([{"loss": "a", "delta": "d", "seed": s, "expected_reward": r}
                           for s, r in enumerate([4.0, 4.1, 3.9])]
                          + [{"loss": "b", "delta": "d", "seed": s, "expected_reward": r}
                             for s, r in enumerate([2.0, 2.1, 1.9])])
    tab = toy_sort.summary_table(finals).set_index("loss")
    assert tab.loc["b", "below_best"] and tab.loc["b", "vs_best"] == pytest.approx(-2.0)


def test_report_names_missing_data(tmp_path, capsys):
    with pytest.raises(SystemExit):
        toy_sort.main(["--dir", str(tmp_path)])
    assert "curves.parquet" in capsys.readouterr().err
