"""The input, param and resource functions of the rules that run per track, variant, model or family
replicate (tracks.smk, families.smk): each takes Snakemake's ``wildcards`` and reads the run's
settings from ``Runs`` (resolved once per run) and its paths from ``Layout``.

Resume: a forced rerun (--forcerun RULE, -f, -F) passes `--resume never` and starts afresh; otherwise
`rlpipe train --resume auto` decides (rlpipe.trainer.resume). The mode is a resource, not a param, so
forcing one invocation does not make the next one rerun the run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from snakemake.io import ancient

from rlpipe import slurm
from rlpipe.config import Track
from rlpipe.contract import CHECKPOINT_FILE
from rlpipe.workflow import gpus
from rlpipe.workflow.layout import Layout, uses_dataset
from rlpipe.workflow.params import canonical, forced, ident
from rlpipe.workflow.runs import TRACK_RUN, Runs


class Jobs:
    """``dag_settings``: a callable giving Snakemake's ``workflow.dag_settings`` when a job asks;
    ``code_inputs``: command names -> the report code inputs (rlpipe.workflow.code_inputs);
    ``track_configs``, ``family_configs``: name -> resolved config file (rlpipe.workflow.resolved)."""

    def __init__(self, layout: Layout, runs: Runs, *, run_tests: bool, dag_settings: Callable[[], Any],
                 code_inputs: Callable[..., list], track_configs: Mapping[str, str],
                 family_configs: Mapping[str, str]):
        self.layout, self.runs = layout, runs
        self.run_tests, self._dag_settings, self._code_inputs = run_tests, dag_settings, code_inputs
        self.track_configs, self.family_configs = track_configs, family_configs
        self._eval_params = cache(self._eval_params_of)
        self._params_count = cache(self._params_count_of)

    def tests_done(self) -> list:
        """Training waits for the unit tests (a broken package never burns GPU hours). ancient():
        re-running the tests later does not make finished runs look outdated."""
        return [ancient(self.layout.res("tests", "junit.xml"))] if self.run_tests else []

    def _forced(self, rule: str, outputs) -> bool:
        return forced(self._dag_settings(), rule, outputs)

    def _params_count_of(self, track: str) -> int:
        t = self.layout.tracks[track]
        return slurm.model_parameters(t.pipeline.model, t.base_model)

    def train_params_count(self, t: Track) -> int:
        """Parameters of a track's model (a given HF directory's, else its preset's): what its training
        jobs' memory and time come from (rlpipe.slurm)."""
        return self._params_count(t.name)

    # ------------------------------------------------------------------ a track's runs
    def track_config(self, wildcards) -> str:
        """The track's resolved pipeline config: a resource, not a param (rlpipe.workflow.resolved)."""
        return self.track_configs[self.layout.track_of(wildcards).name]

    def track_variant(self, wildcards):
        return self.runs.track_variant(wildcards.tdir, wildcards.variant)

    def train_inputs(self, wildcards) -> dict:
        t, train = self.track_variant(wildcards)
        inputs = {"base": self.layout.track_base_inputs(t), "tests": self.tests_done()}
        if uses_dataset(t, train):
            inputs["dataset"] = self.layout.track_dataset_inputs(t)
        return inputs

    def train_params(self, wildcards) -> dict:
        """params of train_variant: the resolved settings (a change reruns the run), --base, --dataset."""
        t, train = self.track_variant(wildcards)
        return {"train": canonical(ident(train, "train")), "base": self.layout.track_base(t),
                "dataset": f"--dataset {self.layout.track_dataset_dir(t)}" if uses_dataset(t, train) else ""}

    def train_mem_mb(self, wildcards) -> int:
        return slurm.train_mem_mb(self.train_params_count(self.layout.track_of(wildcards)))

    def train_runtime(self, wildcards) -> int:
        t, train = self.track_variant(wildcards)
        return slurm.train_runtime_min(self.train_params_count(t), train)

    def train_threads(self, wildcards) -> int:
        return self.runs.track_threads(self.layout.track_of(wildcards))

    def resume_mode(self, wildcards) -> str:
        """`rlpipe train --resume`: a forced rerun starts afresh; otherwise (a first run, changed
        settings, --rerun-incomplete after a crash) rlpipe.trainer.resume decides."""
        outs = self.layout.track_run_outputs(self.layout.track_of(wildcards).name, wildcards.variant).values()
        return "never" if self._forced("train_variant", outs) else "auto"

    # ------------------------------------------------------------------ evaluations and reports
    def eval_inputs(self, wildcards) -> dict:
        """`rlpipe eval` of a track's base model or of a variant's final policy (its checkpoints/last.pt,
        which is not a declared output: the run's run_info.json stands for it)."""
        t = self.layout.track_of(wildcards)
        model = (self.layout.track_base_inputs(t) if wildcards.model == "base"
                 else self.layout.track_run_outputs(t.name, wildcards.model)["info"])
        return {"model": model, "dataset": self.layout.track_dataset_inputs(t)}

    def eval_params(self, wildcards) -> dict:
        """params of evaluate_model, computed once per job (each param reads one key)."""
        return self._eval_params(wildcards.tdir, wildcards.model)

    def _eval_params_of(self, tdir: str, model: str) -> dict:
        t, lay = self.layout.by_dir[tdir], self.layout
        policy = lay.track_base(t) if model == "base" else lay.track_res(t.name, "runs", model, CHECKPOINT_FILE)
        size = f"--n {t.eval_size}" + (f" --max-tokens {t.eval_max_tokens}" if t.eval_max_tokens else "")
        return {"cfg": canonical({"eval": [t.eval_size, t.eval_max_tokens], "train": ident(t.pipeline.train, "train")}),
                "checkpoint": policy, "dataset": lay.track_dataset_dir(t), "size": size}

    def eval_device(self, wildcards) -> str:
        """`rlpipe eval --device`: where the track trains (rlpipe.workflow.gpus.eval_device)."""
        return gpus.eval_device(self.layout.track_of(wildcards))

    def eval_gpus(self, wildcards) -> int:
        return gpus.device_gpus(self.eval_device(wildcards))

    def track_report_inputs(self, wildcards) -> dict:
        t = self.layout.track_of(wildcards)
        models = ["base", *t.pipeline.variants]
        return {"evals": [self.layout.track_eval_outputs(t.name, m)["summary"] for m in models],
                "runs": [self.layout.track_run_outputs(t.name, v)["metrics"] for v in t.pipeline.variants],
                "code": self._code_inputs("math-report")}

    def track_summary_inputs(self, wildcards) -> dict:
        t = self.layout.track_of(wildcards)
        runs = [self.layout.track_run_outputs(t.name, v) for v in t.pipeline.variants]
        return {"info": [r["info"] for r in runs], "metrics": [r["metrics"] for r in runs],
                "code": self._code_inputs("aggregate")}

    # ------------------------------------------------------------------ families
    def family_trained_outputs(self, family: str, variant: str, seed) -> dict:
        """The run files a family replicate reads: those of the run that trains it."""
        owner, a, b = self.runs.owners[(family, variant, seed)]
        if owner == TRACK_RUN:
            return self.layout.track_run_outputs(a, b)
        return self.layout.family_run_outputs(owner, a, b)

    def family_threads(self, wildcards) -> int:
        return self.runs.family_job_threads(wildcards.family)

    def family_train_inputs(self, wildcards) -> dict:
        t = self.runs.family_track(wildcards.family)
        inputs = {"base": self.layout.track_base_inputs(t), "tests": self.tests_done()}
        if uses_dataset(t, self.runs.family_cfg(wildcards.family).train):
            inputs["dataset"] = self.layout.track_dataset_inputs(t)
        return inputs

    def family_base(self, wildcards) -> str:
        return self.layout.track_base(self.runs.family_track(wildcards.family))

    def family_dataset_arg(self, wildcards) -> str:
        t = self.runs.family_track(wildcards.family)
        used = uses_dataset(t, self.runs.family_cfg(wildcards.family).train)
        return f"--dataset {self.layout.track_dataset_dir(t)}" if used else ""

    def family_variant_train(self, wildcards) -> str:
        """The replicate's resolved train settings (a params value: a change of an identity key reruns exactly it)."""
        train = self.runs.family_train(wildcards.family, wildcards.fvariant)
        return canonical(dict(ident(train, "train"), seed=int(wildcards.fseed)))

    def family_mem_mb(self, wildcards) -> int:
        return slurm.train_mem_mb(self.train_params_count(self.runs.family_track(wildcards.family)))

    def family_runtime(self, wildcards) -> int:
        train = self.runs.family_train(wildcards.family, wildcards.fvariant)
        return slurm.train_runtime_min(self.train_params_count(self.runs.family_track(wildcards.family)), train)

    def family_resume_mode(self, wildcards) -> str:
        outs = self.layout.family_run_outputs(wildcards.family, wildcards.fvariant, wildcards.fseed).values()
        return "never" if self._forced("train_family_run", outs) else "auto"

    def family_config(self, wildcards) -> str:
        return self.family_configs[wildcards.family]

    def family_report_inputs(self, wildcards) -> dict:
        f = wildcards.family
        runs = self.runs.family_runs(f)
        return {"metrics": [self.family_trained_outputs(f, v, s)["metrics"] for v, s in runs],
                "info": [self.family_trained_outputs(f, v, s)["info"] for v, s in runs],
                "code": self._code_inputs("family-report")}

