"""rlpipe.slurm without a cluster: SLURM's job records parsed, the line a killed job gets, and the
resources a training job asks for (tests/test_slurm.py runs all of it on a real SLURM)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rlpipe import slurm
from rlpipe.lm.model import ModelConfig

RECORD = ("JobId=42 JobName=85e7 UserId=root(0) JobState=TIMEOUT Reason=TimeLimit TimeLimit=00:01:00 "
          "SubmitTime=2030-01-02T03:04:05 NodeList=rlnode2 TRES=cpu=2,mem=4006M,node=1,billing=2,gres/gpu=2 "
          "Command=(null) WorkDir=/w/a b Comment=rule_train_variant_wildcards__k2  "
          "StdErr=/w/a b/.snakemake/slurm_logs/rule_train_variant/_k2/42.log StdIn=/dev/null "
          "StdOut=/w/a b/.snakemake/slurm_logs/rule_train_variant/_k2/42.log Power=")


def test_scontrol_records_parse_with_spaces_in_paths():
    (job,) = slurm.parse_scontrol(RECORD)
    assert job["JobId"] == "42" and job["JobState"] == "TIMEOUT" and job["WorkDir"] == "/w/a b"
    assert job["StdOut"] == "/w/a b/.snakemake/slurm_logs/rule_train_variant/_k2/42.log"
    assert job["TRES"].endswith("gres/gpu=2")
    assert slurm.job_label(job) == "train_variant k2"
    group = {"Comment": "rule_analysis_aggregate_metrics_aggregate_track_plot_kl", "JobName": "x",
             "StdOut": "/w/.snakemake/slurm_logs/group_analysis_aggregate_metrics_aggregate_track_.../7.log"}
    assert slurm.job_label(group) == "group analysis"


def test_a_killed_job_gets_one_line_with_its_log_and_the_resume_command():
    (job,) = slurm.parse_scontrol(RECORD)
    argv = ["/venv/bin/snakemake", "--workflow-profile", "workflow/profiles/slurm", "--configfile", "my file.yaml"]
    (line,) = slurm.killed_job_lines([job], since_s=0, argv=argv)
    assert line == ("rlpipe: SLURM job 42 (train_variant k2) ran past its time limit (00:01:00); SLURM log: "
                    "/w/a b/.snakemake/slurm_logs/rule_train_variant/_k2/42.log; resume with: snakemake "
                    "--workflow-profile workflow/profiles/slurm --configfile 'my file.yaml' (training continues "
                    "from its checkpoint)")
    cancelled = dict(job, JobState="CANCELLED")
    assert "was cancelled" in slurm.killed_job_lines([cancelled], 0, argv)[0]
    # a failed command has its own error; a job from before this run is not this run's
    assert slurm.killed_job_lines([dict(job, JobState="FAILED"), dict(job, JobState="COMPLETED")], 0, argv) == []
    assert slurm.killed_job_lines([job], since_s=4e9, argv=argv) == []


def test_training_resources_grow_with_the_model_and_steps_from_a_floor():
    tiny = ModelConfig.from_preset("cpu-tiny").num_parameters()
    assert slurm.train_mem_mb(0) == slurm.MEM_FLOOR_MB
    assert slurm.train_mem_mb(1_500_000_000) == slurm.MEM_FLOOR_MB + 54_000  # 36 bytes a parameter
    train = SimpleNamespace(n_grpo_steps=4, rollout_batch_size=8, sampling_max_tokens=12, device="cpu")
    assert slurm.train_runtime_min(tiny, train) == slurm.RUNTIME_FLOOR_MIN + 1
    big = SimpleNamespace(n_grpo_steps=200, rollout_batch_size=256, sampling_max_tokens=1024, device="cuda")
    # 6 x 1.5e9 x (200 x 256 x 1024 x 2) FLOPs at 2e13 FLOP/s: 786.4 min, so 787, plus the floor
    assert slurm.train_runtime_min(1_500_000_000, big) == slurm.RUNTIME_FLOOR_MIN + 787


def test_hf_parameters_from_config_json(tmp_path):
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 600,
           "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    attn = 2 * 64 * 64 + 2 * 64 * 32  # q and o full width; k and v at 2 of 4 heads
    assert slurm.hf_parameters(tmp_path) == 600 * 64 + 2 * (attn + 3 * 64 * 128)
    assert slurm.hf_parameters(tmp_path / "missing") is None
    section = SimpleNamespace(preset="cpu-tiny", overrides={"num_layers": 1})
    assert slurm.model_parameters(section, str(tmp_path)) == slurm.hf_parameters(tmp_path)
    assert slurm.model_parameters(section) == ModelConfig.from_preset("cpu-tiny", num_layers=1).num_parameters()


@pytest.mark.parametrize("local,cores,expected", [(True, 2, 2), (False, None, None)])
def test_run_cores_is_none_under_a_cluster_executor(local, cores, expected):
    class Workflow:
        local_exec = local

        @property
        def cores(self):  # Snakemake's raises without a total, as under a cluster executor
            if cores is None:
                raise RuntimeError("Workflow requires a total number of cores to be defined")
            return cores

    assert slurm.run_cores(Workflow()) == expected
