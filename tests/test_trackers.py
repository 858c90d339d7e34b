"""logging.trackers: W&B and MLflow get every metric of every step of a run, its config and files,
through a background writer that a raising or blocking tracker cannot hold up; a resumed run
continues its tracker runs without logging a step twice; a real training run (Ray, the tiny test
config) is in both stores. Read back through each library's own API: MLflow's client, W&B's
offline run records (``tests/wandb_records.py``). TensorBoard: ``tests/test_tensorboard.py``."""

from __future__ import annotations

import importlib.util
import json
import math
import time

import numpy as np
import pandas as pd
import pytest

from rlpipe import contract
from rlpipe.config import ConfigError, parse_config
from rlpipe.config.checks import check_trackers
from rlpipe.trainer.drivers import common
from rlpipe.trainer.run_writer import RunWriter
from rlpipe.trainer.trackers import open_trackers, pump
from rlpipe.trainer.trackers.base import metric_items
from rlpipe.trainer.trackers.mlflow_run import RUN_KEY_TAG, tracking_uri
from rlpipe.trainer.trackers.naming import run_spec
from rlpipe.trainer.trackers.wandb_run import default_mode

pytest.importorskip("wandb")
pytest.importorskip("mlflow")
from bad_trackers import Blocks, Raises
from wandb_records import read_run

CONFIG = {"train": {"learning_rate": 1e-3, "seed": 3}, "variant": "k2", "model": {"preset": "cpu-tiny"}}


@pytest.fixture
def tracker_env(tmp_path, monkeypatch):
    """W&B offline with its config and caches in tmp; MLflow's default store under the results dir
    (read back here: its file store needs MLFLOW_ALLOW_FILE_STORE). The trackers are given time to
    end: these tests check what arrives, not how fast (``rlpipe bench trackers`` measures that)."""
    monkeypatch.setattr(pump, "FINISH_TIMEOUT_S", 120.0)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    for var in ("MLFLOW_TRACKING_URI", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "results"


def full_row(step: int, rng) -> dict:
    """A row with every metric column measured except one (NaN: not logged at that step)."""
    row = {c: float(rng.normal()) for c in contract.METRIC_COLUMNS}
    row.update(step=step, policy_version=step, samples=8 * step, wall_time=1.5 * step)
    row["reward/val_mean"] = math.nan if step % 2 else 0.1 * step
    return row


def run_writer(results, run_dir, names, **kw) -> RunWriter:
    return RunWriter(run_dir, trackers=open_trackers(names, run_dir, results, "k2", 3, CONFIG, **kw))


def mlflow_history(results, run_dir) -> tuple[object, dict[str, list[tuple[int, float]]]]:
    from mlflow.tracking import MlflowClient

    key = (run_dir / contract.CHECKPOINT_DIR / "trackers.json").read_text().split('"key": "')[1].split('"')[0]
    client = MlflowClient(tracking_uri=tracking_uri(results))
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'")
    assert len(runs) == 1  # one MLflow run per training run, resumed or not
    run = runs[0]
    return run, {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
                 for k in run.data.metrics}


def logged_up_to(run_dir, step: int, names: list[str], within_s: float = 120.0) -> None:
    """Wait until every tracker of ``names`` has logged ``step`` (the trackers' state file says so)."""
    deadline = time.monotonic() + within_s
    path = run_dir / contract.CHECKPOINT_DIR / "trackers.json"
    while time.monotonic() < deadline:
        last = json.loads(path.read_text())["last_step"] if path.is_file() else {}
        if all(last.get(n, -1) >= step for n in names):
            return
        time.sleep(0.2)
    raise AssertionError(f"the trackers had not logged step {step} within {within_s} s")


def expected(rows) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        for name, value in metric_items(r):
            out.setdefault(name, []).append((int(r["step"]), value))
    return out


def test_every_metric_arrives_at_every_step_with_config_and_files(tracker_env):
    results, rng = tracker_env, np.random.default_rng(0)
    run_dir = results / "families" / "lr_sweep" / "runs" / "k2" / "seed3"
    w = run_writer(results, run_dir, ["wandb", "mlflow"])
    rows = []
    for step in range(6):
        rows.append(full_row(step, rng))
        w.add_row(rows[-1])
        w.flush()
    w.finish({"variant": "k2"})
    want = expected(rows)
    assert len(want) == len(contract.METRIC_COLUMNS) - 1  # every column but the step itself

    run, got = mlflow_history(results, run_dir)
    assert {k: sorted(v) for k, v in got.items()} == want
    client_params = run.data.params
    assert client_params["train.learning_rate"] == "0.001" and client_params["variant"] == "k2"
    assert run.info.status == "FINISHED" and run.info.run_name == "k2/seed3"
    assert run.data.tags["rlpipe.family"] == "lr_sweep"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri(results))
    assert client.get_experiment(run.info.experiment_id).name == "rlpipe/families/lr_sweep"
    assert {a.path for a in client.list_artifacts(run.info.run_id, "run")} == {"run/run_info.json", "run/curves.png"}

    wb = read_run(run_dir)
    assert wb["groups"] == ["families/lr_sweep"] and wb["names"] == ["families/lr_sweep/k2/seed3"]
    assert wb["config"]["train"]["learning_rate"] == 1e-3 and wb["config"]["rlpipe"]["seed"] == 3
    assert wandb_series(wb["history"]) == {k: [(s, pytest.approx(v)) for s, v in pts] for k, pts in want.items()}
    assert {"run_info.json", "curves.png"} <= set(wb["files"]) and wb["exit_codes"] == [0]


def test_a_resumed_run_continues_its_tracker_runs_and_logs_no_step_twice(tracker_env):
    results, rng = tracker_env, np.random.default_rng(1)
    run_dir = results / "runs" / "k2"
    rows = [full_row(s, rng) for s in range(8)]
    w = run_writer(results, run_dir, ["wandb", "mlflow"])
    for r in rows[:5]:
        w.add_row(r)
    w.flush(snapshot=True)  # the checkpoint's snapshot at step 4, which both trackers log ...
    logged_up_to(run_dir, 4, ["wandb", "mlflow"])
    w.close()  # ... and the run is killed: its tracker runs end as failed
    resumed = run_writer(results, run_dir, ["wandb", "mlflow"])
    resumed.resume_from(3)  # from the checkpoint of step 3: step 4 is computed again
    for r in rows[4:]:
        resumed.add_row(r)
        resumed.flush()
    resumed.finish({"variant": "k2"})

    run, got = mlflow_history(results, run_dir)
    assert {k: sorted(v) for k, v in got.items()} == expected(rows)  # every step once, in one run
    assert run.info.status == "FINISHED"
    wb = read_run(run_dir)
    assert len(set(wb["ids"])) == 1 and len(wb["ids"]) == 2  # two offline logs of one W&B run
    steps = [s for s, values in wb["history"] if "samples" in values]
    assert steps == list(range(8))
    assert wb["exit_codes"] == [1, 0]


def test_a_tracker_that_raises_or_blocks_never_holds_up_the_run(tracker_env, capfd, monkeypatch):
    monkeypatch.setattr(pump, "FINISH_TIMEOUT_S", 3.0)  # "blocks" never ends: the run waits this long for it
    results, rng = tracker_env, np.random.default_rng(2)
    run_dir = results / "runs" / "k2"
    w = run_writer(results, run_dir, ["tensorboard"], extra=[Raises, Blocks])
    rows = [full_row(s, rng) for s in range(5)]
    for r in rows:
        w.add_row(r)
        w.flush()  # returns while "blocks" is stuck and after "raises" failed
    logged_up_to(run_dir, 4, ["tensorboard"])
    w.finish({"variant": "k2"})  # the trackers' process ends: "blocks" is given up on
    w.close()
    out = capfd.readouterr().out  # the trackers' process writes to the run's stdout
    assert out.count("rlpipe trackers: raises failed (ConnectionError: tracker server unreachable)") == 1
    assert out.count("rlpipe trackers: blocks had not finished 3 s after the run ended") == 1
    assert out.count("rlpipe trackers:") == 2, out
    assert (run_dir / contract.RUN_INFO_FILE).is_file()
    from test_tensorboard import scalars

    got = scalars(run_dir / contract.TENSORBOARD_DIR)  # the tracker beside them got every step
    assert {k: v for k, v in got.items()} == {k: [(s, pytest.approx(v)) for s, v in pts]
                                              for k, pts in expected(rows).items()}


def test_names_group_a_familys_replicates_and_a_tracks_variants(tmp_path):
    res = tmp_path / "results"
    names = {str(p): run_spec(res / p, res, "key", p.split("/")[-2 if "seed" in p else -1], 1, {})
             for p in ("runs/k2", "math/runs/base", "tracks/digits/runs/k8", "families/lr/runs/a/seed1")}
    assert [(s.group, s.name, s.family) for s in names.values()] == [
        ("keyword", "keyword/k2/seed1", None), ("math", "math/base/seed1", None),
        ("digits", "digits/k8/seed1", None), ("families/lr", "families/lr/a/seed1", "lr")]
    elsewhere = run_spec(tmp_path / "mine" / "k2", res, "key", "k2", 0, {})
    assert elsewhere.group == "mine"


def test_wandb_is_offline_without_a_key_and_follows_wandb_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert default_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert default_mode() == "disabled"


def test_mlflow_store_is_under_the_results_dir_unless_the_user_set_one(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri(tmp_path) == (tmp_path / "mlruns").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert tracking_uri(tmp_path) == "http://mlflow.example:5000"


@pytest.mark.parametrize("name, extra", [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_tracker_named_but_not_installed_is_refused_naming_its_extra(monkeypatch, name, extra):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda mod, *a: None if mod == name else real(mod, *a))
    cfg = parse_config({"logging": {"trackers": [name]}})
    with pytest.raises(ConfigError, match=rf"logging\.trackers names '{name}'.*pip install -e '\.\[{extra}\]'"):
        check_trackers(cfg)
    check_trackers(parse_config({}))  # none named: nothing to install


@pytest.mark.ray
def test_a_training_run_is_in_both_stores_and_a_failing_tracker_is_said_once(
        tracker_env, ray_session, tiny_base, write_config, monkeypatch, capfd):
    from rlpipe.trainer.run import run

    results = tracker_env
    cfg = write_config(results.parent / "c.yaml", train={"n_grpo_steps": 3},
                       logging={"trackers": ["wandb", "mlflow"]},
                       workflow={"threads_per_variant": 2, "results_dir": str(results)})
    real_open = common.open_trackers
    monkeypatch.setattr(common, "open_trackers", lambda *a, **k: real_open(*a, **k, extra=[Raises]))
    out = results / "families" / "fam" / "runs" / "onpolicy" / "seed5"
    info = run(str(cfg), "onpolicy", str(out), tiny_base[0], tiny_base[1], threads=2, seed=5)
    assert info["total_optimizer_steps"] == 3
    log = capfd.readouterr().out
    assert log.count("rlpipe trackers: raises failed") == 1
    assert log.count("rlpipe trackers:") == 1, log  # wandb and mlflow said nothing: they worked

    rows = pd.read_parquet(out / contract.METRICS_FILE).to_dict("records")
    want: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        for name, value in metric_items(r):
            want.setdefault(name, []).append((int(r["step"]), value))
    assert [s for s, _ in want["samples"]] == [0, 1, 2, 3]
    run_, got = mlflow_history(results, out)
    assert {k: sorted(v) for k, v in got.items()} == want
    assert run_.info.run_name == "onpolicy/seed5" and run_.info.status == "FINISHED"
    wb = read_run(out)
    assert wb["groups"] == ["families/fam"] and wb["exit_codes"] == [0]
    assert wandb_series(wb["history"]) == {k: [(s, pytest.approx(v)) for s, v in pts] for k, pts in want.items()}
    assert {"run_info.json", "curves.png"} <= set(wb["files"])


def wandb_series(history) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(step, value)]} of a W&B offline run's history records, its figures left out."""
    logged: dict[str, list[tuple[int, float]]] = {}
    for step, values in history:
        for k, v in values.items():
            if not k.startswith("figures/"):
                logged.setdefault(k, []).append((step, v))
    return logged


def test_trackers_bench_reads_its_ratio_against_the_noise_of_the_same_run():
    """``rlpipe bench trackers``' summary by hand: two pairs, loop times without trackers 10 s and 12 s
    (their variation, sd/mean, is 0.1286), with 11 s and 12 s: ratios 1.1 and 1.0, mean 1.05, which is
    within twice that variation; the same ratios over a steadier baseline (10 s, 10.1 s) are not."""
    from rlpipe.bench.trackers import summarize

    def pair(none, with_, contended=False):
        return {"none": {"loop_s": none, "end_s": 0.01, "contended": contended},
                "trackers": {"loop_s": with_, "end_s": 6.0, "contended": contended}, "ratio": with_ / none}

    s = summarize([pair(10.0, 11.0), pair(12.0, 12.0, contended=True)])
    assert s["ratio_mean"] == pytest.approx(1.05) and s["ratio_min"] == pytest.approx(1.0)
    assert s["baseline_cv"] == pytest.approx(2 ** 0.5 / 11) and s["baseline_ratios"] == [pytest.approx(1.2)]
    assert s["within_noise"] is True and s["contended_runs"] == 2 and s["end_s_trackers_median"] == 6.0
    steady = summarize([pair(10.0, 11.0), pair(10.1, 11.0)])
    assert steady["ratio_mean"] > 1.05 and steady["within_noise"] is False
