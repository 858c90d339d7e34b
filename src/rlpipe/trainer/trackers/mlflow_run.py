"""``logging.trackers: [mlflow]``: one MLflow run per training run, in one experiment per track or family.

Store: ``$MLFLOW_TRACKING_URI`` when set; otherwise the local file store ``<results_dir>/mlruns``
(``mlflow ui --backend-store-uri <results_dir>/mlruns``). MLflow 3 refuses a file store unless
``MLFLOW_ALLOW_FILE_STORE=true``, which is set for a file store (this one or the user's) when it is
unset. The file store is the one default: the ``[mlflow]`` extra installs ``mlflow-skinny``, which
writes it but cannot open SQLite (the full ``mlflow``, with its UI, pins an older pyarrow than the
lock's; it runs from an environment of its own).

Experiment ``rlpipe/<group>`` (``rlpipe/keyword``, ``rlpipe/families/<family>``; see
``rlpipe.trainer.trackers.naming``), run name ``<variant>/seed<seed>``, tags for the track,
family, variant, seed and run directory, and ``rlpipe.run_key``: the run's tracker key, by which a
resumed training run finds its MLflow run and continues it. Params: the resolved config as dotted
keys (logged when the run is created). Metrics: every metric of every row at its optimizer step.
Artifacts at the end: ``run_info.json`` and the run's figures. Needs ``pip install -e '.[mlflow]'``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rlpipe.trainer.trackers.base import RunSpec, flat_params, metric_items

STORE_DIR = "mlruns"
RUN_KEY_TAG = "rlpipe.run_key"
_PARAMS_PER_BATCH, _METRICS_PER_BATCH = 100, 1000  # MLflow's log_batch limits


def tracking_uri(results_dir: Path) -> str:
    """``$MLFLOW_TRACKING_URI``, else the file store under the results directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or (results_dir / STORE_DIR).resolve().as_uri()


class MlflowTracker:
    name = "mlflow"
    wants_files = True

    def __init__(self) -> None:
        self.client: Any = None
        self.run_id = ""

    def open(self, spec: RunSpec) -> None:
        uri = tracking_uri(spec.results_dir)
        if uri.startswith("file:") or "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment = self._experiment(f"rlpipe/{spec.group}")
        found = self.client.search_runs([experiment], filter_string=f"tags.`{RUN_KEY_TAG}` = '{spec.key}'",
                                        max_results=1)
        if found:  # a resumed training run continues its MLflow run
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = {RUN_KEY_TAG: spec.key, "rlpipe.track": spec.track, "rlpipe.family": spec.family or "",
                "rlpipe.variant": spec.variant, "rlpipe.seed": str(spec.seed), "rlpipe.run_dir": str(spec.run_dir)}
        self.run_id = self.client.create_run(experiment, run_name=f"{spec.variant}/seed{spec.seed}",
                                             tags=tags).info.run_id
        self._log_params(flat_params(spec.config))

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        got = self.client.get_experiment_by_name(name)
        if got is not None:
            return got.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # another run of the family created it meanwhile
            return self.client.get_experiment_by_name(name).experiment_id

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v[:6000]) for k, v in sorted(params.items())]
        for i in range(0, len(items), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + _PARAMS_PER_BATCH])

    def log_rows(self, rows: list[dict]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, int(row["step"])) for row in rows for name, value in metric_items(row)]
        for i in range(0, len(metrics), _METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + _METRICS_PER_BATCH])

    def finish(self, files: list[Path], ok: bool) -> None:
        for f in files:
            if f.is_file():
                self.client.log_artifact(self.run_id, str(f), artifact_path="run")
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")
