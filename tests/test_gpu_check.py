"""``rlpipe gpu-check`` and its pieces, on CPU: the no-GPU path end to end, the part runner's
limits, kills and failures, the lock differences, the Qwen-shaped config, the
busy-fraction arithmetic, every part's command line, the docs generator and the wheel bundle's
selection and trimming."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import torch

from rlpipe.bench import gpu_bundle, gpu_check, gpu_report, part_runner, qwen_step, stop_check
from rlpipe.bench.gpu_busy import summarize
from rlpipe.bench.lock_diff import lock_differences
from rlpipe.bench.part_runner import Part, run_parts
from rlpipe.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine this would run the whole check")
def test_gpu_check_without_a_gpu_says_so_and_exits_0(tmp_path):
    r = subprocess.run([PY, "-m", "rlpipe.cli", "gpu-check", "--out", str(tmp_path / "gc")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads((tmp_path / "gc" / "gpu_check.json").read_text())
    assert result["gpu"] is None and result["status"] == "no GPU"
    assert list(result["parts"]) == ["machine"] and result["parts"]["machine"]["status"] == "ok"
    assert result["machine"]["torch"] == torch.__version__
    summary = (tmp_path / "gc" / "summary.md").read_text()
    assert "No GPU" in summary and "no GPU" in summary
    assert not list((tmp_path / "gc").glob(".*.tmp"))  # atomic writes leave no temporary file


def _script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return [PY, str(path)]


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_part_over_its_limit_is_killed_with_its_children_and_the_next_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(part_runner, "GRACE_S", 1.0)
    pid_file = tmp_path / "child.pid"
    sleepy = _script(tmp_path, "sleepy", f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # only SIGKILL ends it
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("started", file=sys.stderr, flush=True)
        time.sleep(60)
    """)
    parts = [Part("sleepy", sleepy, limit_s=2.0), Part("next", [PY, "-c", "print('ran')"], limit_s=30)]
    t0 = time.monotonic()
    records = run_parts(parts, tmp_path / "logs", budget_s=100)
    assert time.monotonic() - t0 < 20
    assert records[0]["status"] == "timeout" and 2.0 <= records[0]["seconds"] < 10
    assert records[0]["stderr_tail"] == ["started"]
    assert _gone(int(pid_file.read_text())), "the part's child outlived the kill"
    assert records[1]["status"] == "ok"
    assert (tmp_path / "logs" / "next.out").read_text().strip() == "ran"


def test_sigterm_to_the_check_kills_the_running_part_first(tmp_path):
    """A part runs in a session of its own, so a signal to the check's process group never reaches
    it: a SIGTERM to the check (a remote runner's time limit) must kill the running part's group
    before the check ends, else the part runs on, holding the GPU and its GPU slot, into a rerun."""
    pid_file = tmp_path / "part.pid"
    part = _script(tmp_path, "long_part", f"""
        import os, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
    """)
    check = _script(tmp_path, "check", f"""
        from pathlib import Path
        from rlpipe.bench.part_runner import Part, run_parts
        run_parts([Part("long", {part!r}, 60)], Path({str(tmp_path / "logs")!r}), budget_s=100)
    """)
    proc = subprocess.Popen(check, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the part did not start"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert _gone(int(pid_file.read_text())), "the running part outlived the check"


def test_a_failing_part_is_recorded_and_the_next_still_runs(tmp_path):
    bad = _script(tmp_path, "bad", """
        import sys
        print("line one", file=sys.stderr)
        print("boom: it broke", file=sys.stderr)
        sys.exit(3)
    """)
    out = tmp_path / "r.json"
    good = [PY, "-c", f"import json; json.dump({{'x': 1}}, open({str(out)!r}, 'w'))"]
    records = run_parts([Part("bad", bad, 30), Part("good", good, 30, result_file=str(out))], tmp_path, 100)
    assert records[0]["status"] == "failed" and records[0]["returncode"] == 3
    assert records[0]["stderr_tail"][-1] == "boom: it broke"
    assert records[1]["status"] == "ok" and records[1]["result"] == {"x": 1}


def test_an_unknown_flag_is_unsupported_and_needs_and_budget_skip(tmp_path):
    refuse = _script(tmp_path, "refuse", """
        import argparse
        argparse.ArgumentParser().parse_args()
    """)
    parts = [Part("bench", [*refuse, "--device", "cuda"], 30), Part("after", [PY, "-c", "pass"], 30, needs=("bench",)),
             Part("free", [PY, "-c", "pass"], 30)]
    records = run_parts(parts, tmp_path, 100)
    assert records[0]["status"] == "unsupported" and "--device cuda" in records[0]["note"]
    assert records[1]["status"] == "skipped" and "needs bench" in records[1]["note"]
    assert records[2]["status"] == "ok"
    spent = run_parts([Part("late", [PY, "-c", "pass"], 30)], tmp_path, budget_s=1.0)
    assert spent[0]["status"] == "skipped" and "budget" in spent[0]["note"]


def test_a_hung_part_leaves_the_later_parts_their_shares(tmp_path, monkeypatch):
    """A part that never ends is capped at the budget less the shares kept for the parts after it,
    so they still run; without the reservation it would take the whole budget and they would be
    skipped."""
    monkeypatch.setattr(part_runner, "GRACE_S", 0.5)
    monkeypatch.setattr(part_runner, "MIN_PART_S", 0.5)
    parts = [Part("hang", ["sleep", "60"], limit_s=60, min_s=1), Part("a", ["sleep", "0.1"], 30, min_s=2),
             Part("b", ["sleep", "0.1"], 30, min_s=2)]
    t0 = time.monotonic()
    records = run_parts(parts, tmp_path, budget_s=9.0)
    assert time.monotonic() - t0 < 9.0
    hang, a, b = records
    assert hang["status"] == "timeout" and 3.0 <= hang["limit_s"] <= 3.5, hang  # 9 - 0.5 - 2 x (2 + 0.5)
    assert a["status"] == b["status"] == "ok", (a, b)
    assert (hang["estimate_s"], a["estimate_s"]) == (1, 2)


def test_shares_are_kept_only_for_parts_that_can_still_run(monkeypatch):
    monkeypatch.setattr(part_runner, "GRACE_S", 5.0)
    later = [Part("needs_x", ["true"], 30, needs=("x",), min_s=100), Part("free", ["true"], 30, min_s=3),
             Part("no_share", ["true"], 30)]
    assert part_runner.reserved_s(later, {"x": {"status": "failed"}}) == 8.0
    assert part_runner.reserved_s(later, {}) == 113.0  # x has not run yet: it may still succeed
    part = Part("p", ["true"], limit_s=60, min_s=10)
    assert part_runner.part_limit(part, left_s=200, reserved=50) == 60  # its own limit
    assert part_runner.part_limit(part, left_s=100, reserved=50) == 45  # what the later shares leave
    assert part_runner.part_limit(part, left_s=40, reserved=50) == 10  # never below its share ...
    assert part_runner.part_limit(part, left_s=12, reserved=50) == 7  # ... nor past the budget


def test_the_parts_shares_fit_the_budget_and_the_goals_come_first(tmp_path):
    parts = gpu_check.build_parts(tmp_path, tmp_path / "c.yaml", gpus=1)
    assert [p.name for p in parts] == list(gpu_check.PART_ORDER)
    assert all(0 < p.min_s <= p.limit_s for p in parts), [(p.name, p.min_s, p.limit_s) for p in parts]
    default = gpu_check.select(parts, None)  # what a check without --parts runs: all but the opt-in parts
    assert [p.name for p in default] == [n for n in gpu_check.PART_ORDER if n not in gpu_check.OPT_IN]
    kept = default[0].min_s + sum(p.min_s + part_runner.GRACE_S for p in default[1:])
    assert kept <= (1 - gpu_check.UNALLOCATED) * gpu_check.BUDGET_S, kept  # slack for an overrun
    assert gpu_check.UNALLOCATED >= 0.10
    order = gpu_check.PART_ORDER.index
    assert order("seed_step") == order("peaks") + 1  # the seed-scale goals first
    goals = ["bench_sampler", "train_onpolicy", "train_k4", "train_disagg", "bench_weight_sync"]
    assert [order(n) for n in goals] == sorted(order(n) for n in goals)
    assert order("seed_step") < min(map(order, goals))
    assert max(order(n) for n in goals) < min(order(n) for n in ("bench_update", "stop_train"))


def test_an_opt_in_part_runs_only_when_named(tmp_path):
    parts = gpu_check.build_parts(tmp_path, tmp_path / "c.yaml", gpus=1)
    assert "bench_trl" in gpu_check.OPT_IN
    assert "bench_trl" not in [p.name for p in gpu_check.select(parts, None)]
    assert "bench_trl" in [p.name for p in gpu_check.select(parts, ["bench_trl"])]


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_part_s_own_timeouts_sit_inside_its_limit(tmp_path, gpus):
    """A part that waits on its own timeout (the stop check's start and stop, a weight sync, the
    machine probe's nvidia-smi) reports it itself, with its log's tail, before the check kills it:
    its timeouts one after the other, with its start-up, stay inside its limit."""
    for part in gpu_check.build_parts(tmp_path, tmp_path / "c.yaml", gpus=gpus):
        own = gpu_check.own_timeouts_s(part)
        assert own + gpu_check.PART_OVERHEAD_S <= part.limit_s, (part.name, own, part.limit_s)
    stop = next(p for p in gpu_check.build_parts(tmp_path, tmp_path / "c.yaml", gpus=1) if p.name == "stop_train")
    assert gpu_check.own_timeouts_s(stop) == gpu_check.STOP_START_TIMEOUT_S + max(gpu_check.STOP_KILL_AFTER_S,
                                                                                   stop_check.GOAL_S)
    # what a part does not pass is its command's default: the stop check's are too long for its limit
    bare = Part("stop_train", [PY, "-m", "rlpipe.bench.stop_check"], limit_s=120)
    assert gpu_check.own_timeouts_s(bare) == stop_check.START_TIMEOUT_S + stop_check.KILL_AFTER_S > 120


def test_stop_check_refuses_a_kill_before_the_goal(tmp_path, capsys):
    with pytest.raises(SystemExit):
        stop_check.main(["--config", "c", "--variant", "v", "--base", "b", "--run-dir", str(tmp_path / "r"),
                         "--out", str(tmp_path / "o.json"), "--kill-after-s", "10"])
    assert "--kill-after-s must be >= the goal" in capsys.readouterr().err


def test_lock_differences_of_a_constructed_lock():
    lock = textwrap.dedent("""\
        # header
        alpha==1.0
            # via beta
        beta==2.0
        Gamma_Pkg[extra]==3.0 ; python_version >= "3.11"
        torch==2.13.0
        pip==24.0
    """)
    installed = {"alpha": "1.0.0", "beta": "2.1", "gamma-pkg": None, "torch": "2.11.0+cu130", "pip": "1.0"}
    assert lock_differences(lock, installed) == {
        "beta": {"lock": "2.0", "installed": "2.1"},
        "gamma-pkg": {"lock": "3.0", "installed": None},
        "torch": {"lock": "2.13.0", "installed": "2.11.0+cu130"},
    }


def test_qwen_shaped_policy_has_about_1_5b_parameters_without_allocating():
    model = qwen_step.build_policy(qwen_step.qwen_config(), "meta")
    assert all(p.is_meta for p in model.parameters())
    n = qwen_step.parameter_count(model)
    assert 1.50e9 < n < 1.58e9, n  # Qwen2.5-Math-1.5B: 1.54e9 with its embeddings tied
    assert model.lm_head.weight is model.model.embed_tokens.weight
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.vocab_size) == (1536, 28, 12, 2, 8960, 151936)


def test_busy_fraction_of_samples():
    samples = [(0.0, [0.0, 0.0]), (0.1, [50.0, 10.0]), (0.2, [100.0, 0.0]), (0.3, [0.0, 0.0])]
    s = summarize(samples, "test")
    assert s["per_device"] == [0.375, 0.025] and s["busy_fraction"] == 0.375
    assert s["busy_fraction_active"] == 0.75 and s["active_seconds"] == 0.1
    assert summarize([], None)["busy_fraction"] is None


def test_check_config_is_shortened_and_valid(tmp_path):
    cfg = gpu_check.check_config(ROOT / "config", tmp_path / "results", gpus=1)
    assert sorted(cfg["variants"]) == sorted(gpu_check.CHECK_VARIANTS)
    assert cfg["train"]["n_grpo_steps"] == gpu_check.CHECK_OVERRIDES["train"]["n_grpo_steps"]
    assert cfg["train"]["device"] == "cuda" and cfg["model"]["preset"] == "assignment"
    assert cfg["workflow"]["gpus_per_disaggregated"] == 1
    assert gpu_check.check_config(ROOT / "config", tmp_path, gpus=8)["workflow"]["gpus_per_disaggregated"] == 2


class _Parsed(Exception):
    pass


def test_every_part_command_line_parses(tmp_path, monkeypatch):
    """Each part's arguments are accepted by its command's parser (nothing runs), except the
    ``--device`` flag of a bench that has none yet, which the check records as unsupported."""
    unknown: dict[str, list[str]] = {}

    def parse(self, args=None, namespace=None):
        ns, rest = argparse.ArgumentParser.parse_known_args(self, args, namespace)
        unknown[current] = rest
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)
    parts = [*gpu_check.build_parts(tmp_path, tmp_path / "config.yaml", gpus=1, dtype="bfloat16"),
             *gpu_check.build_parts(tmp_path, tmp_path / "config.yaml", gpus=2)]
    for part in parts:
        current = part.name
        assert part.argv[:2] == [PY, "-m"], part.argv
        module = __import__(part.argv[2], fromlist=["main"])
        with pytest.raises(_Parsed):
            module.main(part.argv[3:])
        assert unknown[part.name] in ([], ["--device", "cuda"]), (part.name, unknown[part.name])
        if unknown[part.name]:
            assert part.name.startswith("bench_"), part.name


def test_parts_selection_adds_what_they_need(tmp_path):
    parts = gpu_check.build_parts(tmp_path, tmp_path / "c.yaml", gpus=1)
    names = [p.name for p in gpu_check.select(parts, ["bench_trl"])]
    assert names == ["machine", "data", "tokenizer", "pretrain", "dataset", "bench_trl"]


def _result(tmp_path: Path) -> dict:
    return {"kind": "rlpipe gpu-check", "date": "2026-12-01T10:00:00+00:00", "status": "partial", "wall_s": 400.0,
            "budget_s": 480.0, "gpu": {"name": "NVIDIA H100 80GB HBM3", "count": 1, "compute_capability": "9.0",
                                       "memory_gib": 79.2, "driver": "580.1", "cuda": "13.0"},
            "machine": {"torch": "2.11.0+cu130", "lock_differences": {"torch": {"lock": "2.13.0",
                                                                                "installed": "2.11.0+cu130"}}},
            "parts": {"peaks": {"status": "ok", "seconds": 12.0, "result": {
                          "matmul_bf16": {"shape": [8192] * 3, "tflops": 712.5},
                          "memcpy": {"bytes": 2**30, "gbps": 1510.0, "traffic_gbps": 3020.0}}},
                      "train_k4": {"status": "ok", "seconds": 40.0, "monitor": {"busy_fraction": 0.2,
                                                                                 "busy_fraction_active": 0.31},
                                   "result": {"mode": "colocated_k", "steps": 24, "s_per_step_median": 0.42,
                                              "wall_time_s": 15.0}},
                      "bench_update": {"status": "unsupported", "seconds": 3.0,
                                       "note": "not supported by this bench yet: --device cuda", "result": None},
                      "bench_sampler": {"status": "ok", "seconds": 50.0,
                                        "result": {"kv_tokens_per_s": 23097.0, "device": "cuda"}},
                      "stop_train": {"status": "ok", "seconds": 70.0, "result": {
                          "variant": "onpolicy", "goal_s": 30.0, "met": False, "step_at_signal": 6, "exit_s": 41.5,
                          "exit_code": 143, "ray_processes_at_signal": ["1 raylet", "2 gcs_server"],
                          "ray_processes_left_after_goal": ["2 gcs_server"], "ray_processes_gone_s": None,
                          "checkpoint": {"loads": True, "step": 7, "matches_stop": True}}}}}


def test_docs_generator_empty_and_with_a_result(tmp_path):
    assert gpu_report.render_results(tmp_path / "none") == gpu_report.EMPTY + "\n"
    (tmp_path / "2026-12-01-h100.json").write_text(json.dumps(_result(tmp_path)))
    text = gpu_report.render_results(tmp_path)
    assert "NVIDIA H100 80GB HBM3: `benchmarks/gpu/2026-12-01-h100.json`" in text
    assert "bf16 matmul at 8192x8192x8192: 712 TFLOP/s" in text
    assert "1,510 GB/s copied" in text
    assert "| k4 | colocated_k | 24 | 0.42 | 15 | 0.2 | 0.31 |" in text
    assert "| bench_update | unsupported | 3 | not supported by this bench yet: --device cuda |" in text
    assert "kv_tokens_per_s: 23,097" in text
    assert "torch 2.11.0+cu130 (lock 2.13.0)" in text
    assert ("SIGTERM to `rlpipe train` (onpolicy) at optimizer step 6: exit 143 after 41.5 s; its 2 Ray processes "
            "NOT gone after 30 s: 2 gcs_server") in text
    assert "- checkpoint loads (optimizer step 7, the step it stopped at: yes)" in text
    assert "with the checkpoint intact: **not met**" in text
    page = f"head\n{gpu_report.BEGIN}\nold\n{gpu_report.END}\ntail\n"
    assert gpu_report.replace_section(page, "new") == f"head\n{gpu_report.BEGIN}\n\nnew\n\n{gpu_report.END}\ntail\n"
    with pytest.raises(ValueError, match="needs one"):
        gpu_report.replace_section("no markers", "new")


def test_the_committed_gpu_page_is_the_generators_output():
    page = (ROOT / "docs" / "gpu-and-clusters.md").read_text()
    body = gpu_report.render_results(ROOT / "benchmarks" / "gpu")
    assert gpu_report.replace_section(page, body) == page, (
        "docs/gpu-and-clusters.md is stale: rlpipe gpu-report --results benchmarks/gpu --page docs/gpu-and-clusters.md")


def test_bundle_selection_of_a_constructed_lock():
    lock = "ray==2.60.0\ntorch==2.13.0\nnvidia-cublas-cu12==12.8\nmkdocs==1.6\nsnakemake==9.27.1\n"
    take, left_out = gpu_bundle.wanted(lock, gpu_bundle.IMAGE_PACKAGES, extra=())
    assert take == ["ray==2.60.0", "snakemake==9.27.1"]
    assert left_out == {"torch": "in the image", "nvidia-cublas-cu12": "CUDA library (the image's torch brings "
                        "its own)", "mkdocs": "development only"}
    freeze_take, _ = gpu_bundle.wanted(lock, frozenset({"ray"}), extra=())
    assert freeze_take == ["torch==2.13.0", "snakemake==9.27.1"]


def test_bundle_adds_the_trl_bench_s_pinned_packages():
    """``rlpipe bench trl``'s packages are bundled by default (the lock has no ``bench`` extra), at
    a TRL that pyproject's extra accepts, one version of each: the image's or the lock's win."""
    import tomllib

    from packaging.requirements import Requirement

    take, left_out = gpu_bundle.wanted("ray==2.60.0\n", gpu_bundle.IMAGE_PACKAGES)
    assert take == ["ray==2.60.0", "trl==1.16.0", "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19"]
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["bench"]
    for spec in map(Requirement, extra):
        pin = next(r for r in take if r.startswith(f"{spec.name}=="))
        assert spec.specifier.contains(pin.split("==")[1]), (spec, pin)
    assert all(r.split("==")[0] not in gpu_bundle.IMAGE_PACKAGES for r in take)
    take, left_out = gpu_bundle.wanted("dill==0.3.9\n", gpu_bundle.IMAGE_PACKAGES | {"datasets"})
    assert take == ["dill==0.3.9", "trl==1.16.0", "multiprocess==0.70.19"]
    assert left_out == {"datasets": "in the image", "dill": "locked at 0.3.9"}


def test_bundle_without_the_workflow_leaves_out_what_only_snakemake_needs():
    """``--no-workflow``: Snakemake and the packages that only it (or only such packages, or only
    development tools) require, by the lock's ``# via`` comments; a package that something else
    needs too stays."""
    lock = textwrap.dedent("""\
        # header
        pulp==3.3.2
            # via snakemake
        ray==2.60.0
            # via rlpipe (pyproject.toml)
        referencing==0.37.0
            # via
            #   jsonschema
            #   snakemake
        jsonschema==4.26.0
            # via ray
        snakemake==9.27.1
            # via rlpipe (pyproject.toml)
        sqlmodel==0.0.37
            # via snakemake
        sqlalchemy==2.0.58
            # via sqlmodel
        platformdirs==4.14.8
            # via
            #   snakemake
            #   virtualenv
    """)
    assert gpu_bundle.lock_parents(lock)["referencing"] == {"jsonschema", "snakemake"}
    assert gpu_bundle.lock_parents(lock)["ray"] == {"rlpipe"}
    take, left_out = gpu_bundle.wanted(lock, frozenset(), extra=(), workflow=False)
    assert take == ["ray==2.60.0", "referencing==0.37.0", "jsonschema==4.26.0"]
    assert {n for n, why in left_out.items() if "workflow" in why} == {"pulp", "snakemake", "sqlmodel", "sqlalchemy",
                                                                       "platformdirs"}
    assert len(gpu_bundle.wanted(lock, frozenset(), extra=())[0]) == 8


def test_the_bundle_leaves_out_the_trackers_unless_asked():
    """W&B and MLflow (locked for CI's tracker tests) and what only they need stay out of a bundle,
    most of its size otherwise; --trackers adds them; a package the pipeline needs too stays in."""
    lock = ("wandb==0.31.0\n    # via rlpipe (pyproject.toml)\nsentry-sdk==2.0\n    # via wandb\n"
            "mlflow-skinny==3.17.2\n    # via rlpipe (pyproject.toml)\nsqlparse==0.5\n    # via mlflow-skinny\n"
            "protobuf==7.36.2\n    # via\n    #   ray\n    #   wandb\nray==2.60.0\n    # via rlpipe (pyproject.toml)\n")
    take, left_out = gpu_bundle.wanted(lock, frozenset(), extra=())
    assert take == ["protobuf==7.36.2", "ray==2.60.0"]
    trackers = {n for n, why in left_out.items() if "trackers" in why}
    assert trackers == {"wandb", "sentry-sdk", "mlflow-skinny", "sqlparse"}
    take, _ = gpu_bundle.wanted(lock, frozenset(), extra=(), trackers=True)
    assert len(take) == 6
    take, left_out = gpu_bundle.wanted(lock + "snakemake==9.0\n    # via rlpipe (pyproject.toml)\n", frozenset(),
                                       extra=(), workflow=False)
    assert take == ["protobuf==7.36.2", "ray==2.60.0"] and left_out["snakemake"].startswith("workflow only")


def test_the_lock_and_the_bundle_carry_nvml():
    """NVML's Python binding is locked and bundled (torch.cuda.utilization imports it for the GPU busy
    fraction), although its name starts like the CUDA libraries' that the bundle leaves out."""
    lock_text = (ROOT / "requirements" / "lock.txt").read_text()
    take, _ = gpu_bundle.wanted(lock_text, gpu_bundle.IMAGE_PACKAGES, workflow=False)
    assert any(r.startswith("nvidia-ml-py==") for r in take)
    take, left_out = gpu_bundle.wanted("nvidia-ml-py==13.615.71\nnvidia-cublas-cu12==12.8\n", frozenset(), extra=())
    assert take == ["nvidia-ml-py==13.615.71"] and list(left_out) == ["nvidia-cublas-cu12"]


def _wheel(path: Path, name: str, version: str, requires: list[str]) -> Path:
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
        z.writestr(f"{name}/__init__.py", "")
    return path


def test_the_bundle_names_a_pin_that_conflicts_with_the_lock_or_the_image(tmp_path):
    """datasets 4.8.5's own requirements (as published) against the lock's huggingface-hub 2.4.0 and
    fsspec: each conflict is named; a requirement for another Python or an extra is not one; a
    requirement nothing will provide is named too; the image's versions (``--image-freeze``) win."""
    old = _wheel(tmp_path / "datasets-4.8.5-py3-none-any.whl", "datasets", "4.8.5", [
        "huggingface-hub<2.0,>=0.25.0", "fsspec[http]<=2026.2.0,>=2023.1.0", "dill<0.4.2,>=0.3.0",
        'tomli; python_version < "3.11"', 'pytest; extra == "tests"', "numpy>=1.17"])
    lock = "huggingface-hub==2.4.0\nfsspec==2026.9.0\nnumpy==2.4.6\n"
    image = frozenset({"huggingface-hub", "fsspec", "numpy"})
    have = gpu_bundle.machine_versions(lock, image, {}, ["datasets==4.8.5", "dill==0.4.1"])
    assert gpu_bundle.conflicts([old], have, "3.12") == [
        "datasets 4.8.5 requires huggingface-hub<2.0,>=0.25.0, but the GPU machine gets huggingface-hub 2.4.0",
        "datasets 4.8.5 requires fsspec[http]<=2026.2.0,>=2023.1.0, but the GPU machine gets fsspec 2026.9.0"]
    image_has = gpu_bundle.machine_versions(lock, image, {"huggingface-hub": "1.33.0", "fsspec": "2026.1.0"},
                                            ["datasets==4.8.5", "dill==0.4.1"])
    assert gpu_bundle.conflicts([old], image_has, "3.12") == []
    new = _wheel(tmp_path / "x-1.0-py3-none-any.whl", "x", "1.0", ["huggingface-hub<3,>=1.31", "absent>=1"])
    assert gpu_bundle.conflicts([new], have, "3.12") == [
        "x 1.0 requires absent>=1, which neither the lock, the image nor the bundle has"]


def test_the_bundle_fetches_what_its_wheels_require_and_nothing_the_machine_has(tmp_path):
    """A lean image (torch and transformers only): datasets needs xxhash, which neither the lock nor
    the image has, and xxhash's own (constructed) requirement, a further package: both are fetched,
    each once, at the version the index gives; what the lock or the image has (numpy, torch) is never
    fetched; a requirement with no wheel is named once; the bundle then has no unmet requirement."""
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index / "xxhash-3.6.0-cp312-cp312-manylinux_2_17_x86_64.whl", "xxhash", "3.6.0", ["deep>=1"])
    _wheel(index / "deep-2.0-py3-none-any.whl", "deep", "2.0", ["numpy"])
    folder = tmp_path / "bundle"
    folder.mkdir()
    _wheel(folder / "datasets-5.2.0-py3-none-any.whl", "datasets", "5.2.0",
           ["xxhash", "numpy>=1.17", "torch; extra == 'torch'", "gone>=1"])
    fetched = []

    def from_index(req, dest, python):  # the index: one wheel per name, as pip download --no-deps gives it
        fetched.append(req)
        name = req.split(">")[0].split("=")[0].split("<")[0]
        wheel = next(index.glob(f"{name}-*.whl"), None)
        if wheel is None:
            return None, f"no wheel for CPython {python} on manylinux x86_64"
        (dest / wheel.name).write_bytes(wheel.read_bytes())
        return dest / wheel.name, None

    have = {"numpy": "2.4.6", "torch": "2.11.0", "transformers": "5.0.0", "datasets": "5.2.0"}
    added, missing = gpu_bundle.complete(folder, have, "3.12", fetch=from_index)
    assert sorted(fetched) == ["deep>=1", "gone>=1", "xxhash"]
    assert added == {"xxhash": "xxhash-3.6.0-cp312-cp312-manylinux_2_17_x86_64.whl",
                     "deep>=1": "deep-2.0-py3-none-any.whl"}
    assert missing == {"gone>=1": "no wheel for CPython 3.12 on manylinux x86_64"}
    assert have["xxhash"] == "3.6.0" and have["deep"] == "2.0"
    assert gpu_bundle.conflicts(sorted(folder.glob("*.whl")), have, "3.12") == []


def test_the_bundle_s_extra_pins_lie_in_pyproject_s_extras():
    import tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, pins in (("bench", gpu_bundle.BENCH_PINS), ("nccl", gpu_bundle.NCCL_PINS["12"])):
        for spec in map(Requirement, extras[extra]):
            pin = next(r for r in pins if r.startswith(f"{spec.name}=="))
            assert spec.specifier.contains(pin.split("==")[1]), (spec, pin)
    assert gpu_bundle.NCCL_PINS["13"][0].startswith("cupy-cuda13x==")


@pytest.mark.parametrize(("wheel", "ok"), [
    ("trl-1.16.0-py3-none-any.whl", True),
    ("six-1.17.0-py2.py3-none-any.whl", True),
    ("multiprocess-0.70.19-py312-none-any.whl", True),            # pure, for this Python only
    ("multiprocess-0.70.19-py311-none-any.whl", False),
    ("ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl", True),
    ("pydantic_core-2.41.5-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
    ("cryptography-46.0.3-cp311-abi3-manylinux_2_28_x86_64.whl", True),  # the stable ABI from 3.11 on
    ("x-1.0-cp313-abi3-manylinux_2_28_x86_64.whl", False),                # ... from 3.13 on
    ("ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl", False),   # the host's Python
    ("pulp-3.3.2-cp312-cp312-linux_x86_64.whl", False),           # built here: the host's platform
    ("ray-2.60.0-cp312-cp312-macosx_11_0_arm64.whl", False),
    ("x-1.0-cp311-none-any.whl", False),
    ("wandb-0.31.0-py3-none-manylinux_2_28_x86_64.whl", True),    # a binary that does not link Python
    ("wandb-0.31.0-py3-none-macosx_12_0_arm64.whl", False),
    ("x-1.0-py311-none-manylinux_2_28_x86_64.whl", False),
    ("not-a-wheel.whl", False),
])
def test_the_bundle_never_adds_a_wheel_for_another_python_or_platform(wheel, ok):
    assert gpu_bundle.fits(wheel, "3.12") is ok


def test_bundle_trims_a_wheel_and_its_record(tmp_path):
    src = tmp_path / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"
    files = {"ray/__init__.py": b"x = 1\n", "ray/jars/big.jar": b"\0" * 100, "ray/rllib/a.py": b"",
             "ray/dashboard/client/build/x.js": b"", "ray/dashboard/app.js.map": b"{}",
             "ray-2.60.0.dist-info/METADATA": b"Name: ray\n"}
    record = "".join(f"{n},sha256=abc,1\n" for n in files) + "ray-2.60.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(src, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("ray-2.60.0.dist-info/RECORD", record)
    dst = tmp_path / "out" / src.name
    assert gpu_bundle.trim_wheel(src, dst, gpu_bundle.TRIM["ray"]) == 4
    with zipfile.ZipFile(dst) as z:
        assert sorted(z.namelist()) == ["ray-2.60.0.dist-info/METADATA", "ray-2.60.0.dist-info/RECORD",
                                        "ray/__init__.py"]
        rows = z.read("ray-2.60.0.dist-info/RECORD").decode().splitlines()
    assert [r.split(",")[0] for r in rows] == ["ray/__init__.py", "ray-2.60.0.dist-info/METADATA",
                                               "ray-2.60.0.dist-info/RECORD"]


def test_bundle_reads_an_image_freeze(tmp_path):
    f = tmp_path / "freeze.txt"
    f.write_text("# image\nTorch==2.11.0+cu130\nnumpy @ file:///x\nPyYAML==6.0\n\n")
    assert gpu_bundle.image_names(f) == frozenset({"torch", "numpy", "pyyaml"})


def test_the_gpu_path_records_every_part_and_goes_on(tmp_path, monkeypatch):
    """The check's GPU branch on CPU: the machine part is replaced by one that reports a GPU, and
    the other parts by small commands (one fails); every part is recorded, the JSON and summary
    are written, and the status says not everything succeeded."""
    gpu = {"name": "Test GPU", "count": 1, "compute_capability": "9.0", "memory_gib": 80.0, "driver": "1",
           "cuda": "13.0"}

    def fake_parts(out, config, gpus, dtype="float32"):
        res = out / "parts" / "machine.json"
        write = f"import json, pathlib; p = pathlib.Path({str(res)!r}); p.parent.mkdir(parents=True, exist_ok=True); "
        return [Part("machine", [PY, "-c", write + f"p.write_text(json.dumps({{'gpu': {gpu!r}, 'torch': 'x'}}))"],
                     30, str(res)),
                Part("peaks", [PY, "-c", "import sys; sys.exit('no peaks here')"], 30),
                Part("train_k4", [PY, "-c", f"assert {gpus} == 1 and {str(config)!r}.endswith('config.yaml')"], 30)]

    monkeypatch.setattr(gpu_check, "build_parts", fake_parts)
    result = gpu_check.run_check(tmp_path, 60.0, None, ROOT / "config")
    assert result["gpu"] == gpu and result["status"] == "partial"
    assert {n: r["status"] for n, r in result["parts"].items()} == {"machine": "ok", "peaks": "failed",
                                                                     "train_k4": "ok"}
    assert result["parts"]["peaks"]["stderr_tail"] == ["no peaks here"]
    assert "monitor" in result["parts"]["train_k4"]
    written = json.loads((tmp_path / "gpu_check.json").read_text())
    assert written["parts"].keys() == result["parts"].keys()
    assert (tmp_path / "work" / "config.yaml").is_file()
    summary = (tmp_path / "summary.md").read_text()
    assert "### Test GPU" in summary and "| peaks | failed |" in summary and "no peaks here" in summary


def test_a_stopped_check_says_so(tmp_path, monkeypatch):
    """SIGTERM or Ctrl-C while the parts run (``run_parts`` raises once it killed the running part):
    the JSON says ``stopped`` with what was recorded so far, and the exit goes on."""
    gpu = {"name": "Test GPU", "count": 1}
    res = tmp_path / "parts" / "machine.json"
    write = f"import json, pathlib; p = pathlib.Path({str(res)!r}); p.parent.mkdir(parents=True, exist_ok=True); "
    machine = Part("machine", [PY, "-c", write + f"p.write_text(json.dumps({{'gpu': {gpu!r}}}))"], 30, str(res))
    monkeypatch.setattr(gpu_check, "build_parts", lambda out, config, gpus, dtype="float32": [machine])

    def stopped(parts, log_dir, budget_s, monitor_for=None, on_record=None):
        raise SystemExit(128 + signal.SIGTERM)

    monkeypatch.setattr(gpu_check, "run_parts", stopped)
    with pytest.raises(SystemExit):
        gpu_check.run_check(tmp_path, 60.0, None, ROOT / "config")
    written = json.loads((tmp_path / "gpu_check.json").read_text())
    assert written["status"] == "stopped" and list(written["parts"]) == ["machine"]
    assert "status stopped" in (tmp_path / "summary.md").read_text()


def test_a_training_part_reads_its_run(tmp_path):
    import pandas as pd

    run = tmp_path / "run"
    run.mkdir()
    (run / "run_info.json").write_text(json.dumps({"mode": "colocated_k", "total_optimizer_steps": 3,
                                                   "wall_time_s": 9.0, "config": {"big": 1}}))
    pd.DataFrame({"step": [0, 2, 1, 3], "wall_time": [0.5, 3.0, 2.0, 3.2]}).to_parquet(run / "metrics.parquet")
    r = gpu_check._train_collect(run)()
    assert r["steps"] == 3 and r["mode"] == "colocated_k" and "config" not in r
    assert r["s_per_step_median"] == 1.0  # step-to-step: 1.5, 1.0, 0.2
    assert gpu_check._train_collect(tmp_path / "absent")() is None
    named = gpu_check.committed_name({"date": "2026-12-01T10:00:00+00:00", "gpu": {"name": "NVIDIA H100 80GB HBM3"}})
    assert named == "2026-12-01-nvidia-h100-80gb-hbm3.json"


def test_stop_check_config_raises_the_variant_s_steps_and_refuses_an_unknown_variant(tmp_path, write_config):
    cfg = write_config(tmp_path / "c.yaml", variants={"k4": {"mode": "colocated_k", "k": 4, "n_grpo_steps": 4}})
    data = stop_check.stop_config(cfg, "k4", steps=1000, checkpoint_every=4)
    assert data["variants"]["k4"] == {"mode": "colocated_k", "k": 4, "n_grpo_steps": 1000, "checkpoint_every": 4}
    with pytest.raises(ConfigError, match="no variant 'nope'"):
        stop_check.stop_config(cfg, "nope", steps=1000, checkpoint_every=4)
    with pytest.raises(ConfigError):  # 1001 steps do not divide into k = 4
        stop_check.stop_config(cfg, "k4", steps=1001, checkpoint_every=4)


@pytest.mark.ray
@pytest.mark.slow  # the default suite's tests/test_stop.py stops the same rlpipe train path by SIGTERM
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the check reads /proc (Linux)")
def test_stop_check_stops_a_real_run_and_records_it(tmp_path, tiny_base, write_config):
    """The ``stop_train`` part's module on a real CPU run (tests/test_stop.py checks the stop
    itself; this checks what the part records of it): SIGTERM once the run is in its loop, exit
    143 within the goal, its processes found and gone, the checkpoint read back at the step the
    run said it stopped at."""
    cfg = write_config(tmp_path / "c.yaml", train={"n_grpo_steps": 2},
                       variants={"onpolicy": {"mode": "colocated_sync"}})
    out = tmp_path / "stop.json"
    rc = stop_check.main(["--config", str(cfg), "--variant", "onpolicy", "--base", tiny_base[0], "--dataset",
                          tiny_base[1], "--run-dir", str(tmp_path / "runs" / "stop"), "--threads", "2", "--out",
                          str(out), "--checkpoint-every", "2", "--steps", "2000"])
    rec = json.loads(out.read_text())
    assert rc == 0, rec
    assert rec["exit_code"] == 128 + signal.SIGTERM and rec["exit_s"] <= stop_check.GOAL_S, rec
    assert any("raylet" in p for p in rec["ray_processes_at_signal"]), rec["ray_processes_at_signal"]
    assert rec["ray_processes_left_after_goal"] == [] and rec["ray_processes_gone_s"] is not None
    assert rec["step_at_signal"] is not None and rec["step_at_signal"] >= 2
    assert rec["checkpoint"]["loads"] and rec["checkpoint"]["matches_stop"], rec["checkpoint"]
    assert rec["checkpoint"]["step"] == rec["stopped_at_step"] >= 2
    assert rec["met"] is True
    assert "n_grpo_steps: 2000" in (tmp_path / "runs" / "stop.yaml").read_text()
    text = gpu_report.render_result({"gpu": {"name": "G"}, "date": "2026-12-01", "parts": {
        "stop_train": {"status": "ok", "seconds": 30.0, "result": rec}}})
    assert f"exit {128 + signal.SIGTERM} after {gpu_report._num(rec['exit_s'])} s" in text
    assert "with the checkpoint intact: **met**" in text
