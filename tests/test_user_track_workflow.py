"""A user's track is first-class in the workflow: ``config/smoke.yaml`` shrinks it and keeps its
lists, a run of user tracks only needs no key that switches the built-ins off, its report page
renders without docutils messages, and a dry run or a failed invocation leaves no resolved config
behind (``snakemake -n`` in a temporary working directory)."""

from __future__ import annotations

import io
import re
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from rlpipe.config import overlay_list_replacements, parse_config, resolve_variant, workflow_tracks

pytestmark = pytest.mark.dag

ROOT = Path(__file__).resolve().parents[1]
BUILTIN_SWITCHES = ("run_tests", "toy_sort_seeds", "bench_scaling")


@pytest.fixture
def workdir(tmp_path):
    """The config files and the worked example, whose overlay (my_track.yaml here) sets no key that
    switches the built-in tracks' extras off."""
    shutil.copytree(ROOT / "config", tmp_path / "config")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    overlay = yaml.safe_load((tmp_path / "examples/wordrev/config.yaml").read_text())
    assert not set(BUILTIN_SWITCHES) & set(overlay["workflow"])
    (tmp_path / "my_track.yaml").write_text(yaml.safe_dump(overlay, sort_keys=False))
    return tmp_path


def merged(workdir: Path, *overlays: str) -> dict:
    """The config Snakemake builds: config/config.yaml, then each overlay merged key by key."""
    from snakemake.common.configfile import load_configfile
    from snakemake.utils import update_config

    config = load_configfile(str(workdir / "config/config.yaml"))
    for f in overlays:
        update_config(config, load_configfile(str(workdir / f)))
    return config


def test_smoke_shrinks_a_users_track_and_keeps_its_lists(workdir, dry_run, run_snakemake):
    files = ("my_track.yaml", "config/smoke.yaml")
    proc = run_snakemake(workdir, "-n", "--configfile", *files)
    rules = dry_run.rules(proc.stdout)
    assert {"build_track_data", "pretrain_base", "train_variant", "train_family_run", "report_family",
            "report_track", "write_results_page", "aggregate_track"} <= rules
    # the systems comparison's figures, as the keyword track's
    assert {f"plot_track_{k}" for k in ("phase_breakdown", "phase_steps", "timeline", "weight_sync")} <= rules
    # the user's track only: no built-in track, unit-test gate, toy grid or benchmark (the smoke run, which
    # has the example's track beside the built-in ones, cannot show this)
    assert not rules & {"run_unit_tests", "run_toy_sort", "build_corpus", "build_math_data", "aggregate_metrics"}
    assert not {r for r in rules if r.startswith("bench_")}, rules
    trains = {(j["wildcards"].get("tdir"), j["wildcards"]["variant"])
              for j in dry_run.jobs(proc.stdout) if j["rule"] == "train_variant"}
    assert trains == {("tracks/wordrev/", v) for v in ("onpolicy", "k2", "disagg")}
    fams = {j["wildcards"]["family"] for j in dry_run.jobs(proc.stdout) if j["rule"] == "report_family"}
    assert fams == {"wordrev_systems", "wordrev_lr"}  # the user's list, not one of smoke.yaml's
    assert "replaces" not in proc.stderr  # smoke.yaml replaces no list of the user's
    assert not (workdir / "results").exists()  # a dry run writes no resolved config

    cfg = parse_config(merged(workdir, *files))
    full = parse_config(merged(workdir, "my_track.yaml"))
    assert cfg.workflow.families == ["wordrev_systems", "wordrev_lr"] and cfg.workflow.toy_sort_seeds == [5, 6]
    track, big = workflow_tracks(cfg)["wordrev"], workflow_tracks(full)["wordrev"]
    assert track.pipeline.pretrain.max_steps == 40 < big.pipeline.pretrain.max_steps
    assert track.eval_size == 8 < big.eval_size
    for v in track.pipeline.variants:
        small, orig = resolve_variant(track.pipeline, v), resolve_variant(big.pipeline, v)
        assert (small.n_grpo_steps, orig.n_grpo_steps) == (4, 64)
        assert small.rollout_batch_size == 2 * small.group_size < orig.rollout_batch_size
        assert small.group_size == orig.group_size and small.learning_rate == orig.learning_rate
        assert small.val_size == 8 and small.val_every <= small.n_grpo_steps


def test_an_overlay_replacing_a_list_of_another_is_named(workdir, run_snakemake):
    (workdir / "later.yaml").write_text("workflow: {families: [wordrev_lr]}\n")
    proc = run_snakemake(workdir, "-n", "--configfile", "my_track.yaml", "later.yaml")
    assert re.search(r"warning: \S*later\.yaml replaces workflow\.families: \['wordrev_systems', 'wordrev_lr'\] "
                     r"\(set by \S*my_track\.yaml\) with \['wordrev_lr'\]", proc.stderr), proc.stderr[-2000:]
    msgs = overlay_list_replacements([("a.yaml", {"w": {"x": [1], "y": [2]}}), ("b.yaml", {"w": {"x": [1], "y": [3]}})])
    assert len(msgs) == 1 and msgs[0].startswith("b.yaml replaces w.y: [2] (set by a.yaml) with [3]")


def test_a_failed_invocation_leaves_no_resolved_config(workdir, run_snakemake):
    (workdir / "bad.yaml").write_text("train: {lerning_rate: 0.1}\n")
    proc = run_snakemake(workdir, "-n", "--configfile", "bad.yaml", check=False)
    assert proc.returncode != 0 and "lerning_rate" in proc.stdout + proc.stderr
    proc = run_snakemake(workdir, "-n", "--configfile", "config/smoke.yaml", "--quiet")
    assert not (workdir / "results").exists()


def render_front_page(config: dict, categories: list[str]) -> tuple[str, str]:
    """workflow/report/workflow.rst as ``snakemake --report`` renders it (jinja with trim_blocks, the
    category link targets appended, docutils to HTML): (HTML body, docutils' messages)."""
    from docutils.core import publish_parts
    from jinja2 import Environment
    from snakemake.report import Category

    links = textwrap.dedent("""

    .. _Workflow: javascript:show_panel('workflow')
    {% for cat, catresults in categories|dictsort %}
    .. _{{ cat.name }}: javascript:app.showCategory('{{ cat.name|urlencode }}')
    {% endfor %}
    """)

    class Snakemake:
        pass

    Snakemake.config = config
    env = Environment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string((ROOT / "workflow/report/workflow.rst").read_text() + links).render(
        snakemake=Snakemake, categories={Category(c): {} for c in categories}, files=[])
    messages = io.StringIO()
    body = publish_parts(text, writer_name="html", settings_overrides={"warning_stream": messages})["html_body"]
    return body, messages.getvalue()


@pytest.mark.parametrize("tracks, categories", [
    (["wordrev"], ["0 Answers to the seed questions", "8 Tracks", "9 Experiment families"]),
    (["wordrev"], ["0 Answers to the seed questions", "8 Tracks"]),  # no family
    (["keyword"], ["0 Answers to the seed questions", "1 Results", "2 Reward and KL", "3 Profiling"]),
])
def test_the_report_front_page_names_no_missing_section(tracks, categories):
    body, messages = render_front_page({"workflow": {"tracks": tracks}}, categories)
    assert messages == "" and "System Message" not in body
    if tracks == ["wordrev"]:
        assert "your own tracks only" in body and "Where each deliverable is" not in body
