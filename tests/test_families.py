"""Experiment families (issue 12): config, workflow expansion and the computed report section."""

import json
import math

import pandas as pd
import pytest
import yaml

from rlpipe import contract
from rlpipe.analysis import families, findings
from rlpipe.config import (
    ConfigError,
    active_families,
    family_pipeline,
    family_reference,
    family_seeds,
    load_config,
    parse_config,
    to_dict,
)

FAMILY = {"track": "keyword", "question": "Q?", "base": {"n_grpo_steps": 4}, "replicates": 3,
          "variants": {"a": {}, "b": {"learning_rate": 1e-3}}}


def _cfg(**families):
    return parse_config({"workflow": {"tracks": ["keyword"]}, "families": families})


def test_family_pipeline_resolves_base_variants_and_seeds():
    cfg = _cfg(fam=FAMILY)
    fp = family_pipeline(cfg, "fam")
    assert fp.train.n_grpo_steps == 4 and list(fp.variants) == ["a", "b"] and fp.families == {}
    assert family_seeds(cfg, "fam") == [0, 1, 2]


def test_family_config_of_a_selected_family_parses_again():
    """The written family config is read back by `rlpipe train`: it must not name the family."""
    cfg = parse_config({"workflow": {"tracks": ["keyword"], "families": ["fam"]}, "families": {"fam": FAMILY}})
    fp = family_pipeline(cfg, "fam")
    again = parse_config(to_dict(fp))
    assert again.workflow.families is None and list(again.variants) == ["a", "b"]


@pytest.mark.parametrize("change, key", [
    ({"base": {"n_grpo_steps": 0}}, "families.fam.base.n_grpo_steps"),
    ({"base": {"no_such_key": 1}}, "families.fam.base"),
    ({"variants": {"a": {"learning_rate": -1}}}, "families.fam.variants.a"),
    ({"reference": "zzz"}, "families.fam.reference"),
    ({"replicates": 0}, "families.fam.replicates"),
    ({"variants": {}}, "families.fam.variants"),
    ({"variants": {"a": None}}, "families.fam.variants"),
    ({"variants": {"bad/name": {}}}, "families.fam.variants"),
])
def test_bad_family_names_the_key(change, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _cfg(fam={**FAMILY, **change})


TABLE = {"onpolicy": {"mode": "colocated_sync"}, "disagg": {"mode": "disaggregated"}}


def test_systems_family_is_the_variants_table():
    """A 'systems' family takes the variants table as its variants and its speedup baseline."""
    cfg = parse_config({"workflow": {"tracks": ["keyword"]}, "variants": TABLE,
                        "families": {"sys": {"track": "systems", "replicates": 3}}})
    fp = family_pipeline(cfg, "sys")
    assert list(fp.variants) == ["onpolicy", "disagg"] and fp.train == cfg.train
    assert family_reference(cfg, "sys") == "onpolicy" and family_seeds(cfg, "sys") == [0, 1, 2]
    assert active_families(cfg) == ["sys"]
    off = parse_config({"workflow": {"tracks": ["math"]}, "variants": TABLE, "families": {"sys": {"track": "systems"}}})
    assert active_families(off) == []  # it is the keyword track's


def test_systems_family_without_a_variants_table_is_skipped_unless_named():
    fams = {"sys": {"track": "systems"}, "fam": FAMILY}
    cfg = parse_config({"workflow": {"tracks": ["keyword"]}, "variants": {}, "families": fams})
    assert active_families(cfg) == ["fam"]  # an overlay that drops every variant still loads
    with pytest.raises(ConfigError, match=r"workflow\.families: 'sys' is a systems family"):
        parse_config({"workflow": {"tracks": ["keyword"], "families": ["sys"]}, "variants": {}, "families": fams})


@pytest.mark.parametrize("family, key", [
    ({"track": "systems", "variants": {"a": {}}}, "families.sys.variants"),
    ({"track": "systems", "reference": "zzz"}, "families.sys.reference"),
    ({"track": "keyword"}, "families.sys.variants"),
])
def test_bad_systems_family_names_the_key(family, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config({"workflow": {"tracks": ["keyword"]}, "variants": TABLE, "families": {"sys": family}})


def test_family_of_a_switched_off_track_is_inactive():
    cfg = _cfg(fam={**FAMILY, "track": "math"})
    assert active_families(cfg) == []


def test_default_config_families_resolve():
    cfg = load_config("config/config.yaml")
    names = list(cfg.families)
    assert active_families(cfg) == names  # the default run includes every family
    assert {"lr_sweep", "baselines", "length_norm", "std_norm", "offpolicy_sweep", "clip_ablation",
            "prompt_ablation", "kl_drift", "epochs_per_batch", "offpolicyness"} <= set(names)
    for name in names:
        fp = family_pipeline(cfg, name)
        assert fp.train.task == ("math" if cfg.families[name].track == "math" else "keyword_inclusion")


# --------------------------------------------------------------------------- the report


def _run(d, finals, seed, contended=False, finished=True, val_size=64):
    """A synthetic replicate: validation reward rises linearly from 0.2 to ``finals`` over 4 steps."""
    d.mkdir(parents=True, exist_ok=True)
    rows = []
    for step in range(5):
        row = {c: math.nan for c in contract.METRIC_COLUMNS}
        row.update(step=step, policy_version=step, wall_time=10.0 * step, samples=8 * step)
        row["reward/val_mean"] = 0.2 + (finals - 0.2) * step / 4
        if step:
            row.update({"policy/entropy": 2.0 - 0.1 * step, "response/length_mean": 10.0 + step,
                        "loss/clip_frac": 0.01, "optim/grad_norm": 1.0, "time/generate": 5.0, "time/update": 5.0})
        rows.append(row)
    df = pd.DataFrame(rows, columns=list(contract.METRIC_COLUMNS))
    df.astype({c: "int64" for c in contract.METRIC_INT_COLUMNS}).to_parquet(d / contract.METRICS_FILE)
    info = {"variant": d.parent.name, "mode": "colocated_sync", "devices": 1, "device_type": "cpu",
            "wall_time_s": 40.0 + seed, "total_samples": 32, "total_optimizer_steps": 4, "finished": finished,
            "config": {"seed": seed, "val_size": val_size},
            "conditions": {"contended": contended}}
    (d / contract.RUN_INFO_FILE).write_text(json.dumps(info))


def _family(tmp_path, finals: dict[str, list[float]], **family):
    cfg = {"workflow": {"tracks": ["keyword"]},
           "families": {"fam": {**FAMILY, "variants": {v: {} for v in finals}, **family}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    runs = []
    for v, values in finals.items():
        for seed, final in enumerate(values):
            d = tmp_path / "runs" / v / f"seed{seed}"
            _run(d, final, seed)
            runs.append((v, seed, str(d)))
    return families.load_family(str(tmp_path / "c.yaml"), "fam", runs)


def test_report_calls_a_clear_difference_a_finding_and_a_small_one_noise(tmp_path):
    fam = _family(tmp_path, {"a": [0.50, 0.52, 0.48], "b": [0.80, 0.82, 0.78], "c": [0.51, 0.47, 0.53]})
    numbers = families.build(fam, tmp_path / "out")
    comps = {c["variant"]: c for c in numbers["comparisons"]}
    assert comps["b"]["reward_diff"] == pytest.approx(0.30)
    assert comps["b"]["reward_verdict"] == "exceeds the 95% interval"
    assert comps["c"]["reward_verdict"] == "within replicate noise"
    assert numbers["variants"]["b"]["val_reward_final_n"] == 3
    assert set(numbers) == set(contract.FAMILY_JSON_KEYS)
    for f in contract.FAMILY_REPORT_FILES.values():
        assert (tmp_path / "out" / f).stat().st_size > 0
    table = pd.read_csv(tmp_path / "out" / contract.FAMILY_REPORT_FILES["table"])
    assert list(table.columns) == list(contract.FAMILY_TABLE_COLUMNS)
    text = (tmp_path / "out" / contract.FAMILY_REPORT_FILES["discussion"]).read_text()
    assert "Q?" in text and "exceeds the 95% interval" in text and "Entropy" in text


def test_unreplicated_difference_is_never_a_finding(tmp_path):
    fam = _family(tmp_path, {"a": [0.5], "b": [0.9]}, replicates=1)
    comps, sentences = families.discussion(fam)
    assert comps[0]["reward_verdict"] == "unreplicated"
    assert any("unreplicated, so not a finding" in s for s in sentences)


def test_contended_timings_draw_no_conclusion(tmp_path):
    fam = _family(tmp_path, {"a": [0.5, 0.5], "b": [0.5, 0.5]})
    fam.runs[0].row["contended"] = True
    comps, sentences = families.discussion(fam)
    assert comps[0]["speed_verdict"] == "contended: no conclusion"


def test_speedup_interval_is_the_delta_method_interval_of_the_ratio(tmp_path):
    """Hand-computed: samples/s a = 10, 11, 12 and b = 20, 21, 22 (sd 1, n 3): var(log r) =
    1/(3*11^2) + 1/(3*21^2) = 0.0035107, Welch df 3.02 -> t 3.182, half 0.18854 on the log scale:
    21/11 = 1.909 in [1.909 * e^-0.18854, 1.909 * e^0.18854] = [1.581, 2.305]."""
    fam = _family(tmp_path, {"a": [0.5, 0.5, 0.5], "b": [0.5, 0.5, 0.5]})
    for r, speed in zip(fam.runs, (10.0, 11.0, 12.0, 20.0, 21.0, 22.0), strict=True):
        r.row["samples_per_s"] = speed
    comps, sentences = families.discussion(fam)
    assert comps[0]["speed_ratio"] == pytest.approx(21 / 11)
    assert comps[0]["speed_ratio_lo"] == pytest.approx(1.58105, abs=1e-4)
    assert comps[0]["speed_ratio_hi"] == pytest.approx(2.30519, abs=1e-4)
    assert any("b 1.91x [1.58, 2.31] (exceeds the 95% interval)" in s for s in sentences)
    assert any(s.startswith("Share of the driver's step time in generation / update") for s in sentences)
    fam.runs[0].row["contended"] = True  # a contended comparison prints no interval
    _, sentences = families.discussion(fam)
    assert any("b 1.91x (contended: no conclusion)" in s for s in sentences)


def test_divergence_is_flagged(tmp_path):
    fam = _family(tmp_path, {"a": [0.5, 0.5], "b": [0.0, 0.0]})
    _, sentences = families.discussion(fam)
    assert any(s.startswith("Diverged") and "b (2/2 seeds)" in s for s in sentences)


def test_sweep_axis_names_best_and_worst(tmp_path):
    cfg = {"workflow": {"tracks": ["keyword"]},
           "families": {"fam": {**FAMILY, "x": "learning_rate", "replicates": 1,
                                "variants": {"lo": {"learning_rate": 1e-4}, "hi": {"learning_rate": 1e-2}}}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    for v, final in (("lo", 0.7), ("hi", 0.1)):
        _run(tmp_path / v / "seed0", final, 0)
    fam = families.load_family(str(tmp_path / "c.yaml"), "fam",
                               [(v, 0, str(tmp_path / v / "seed0")) for v in ("lo", "hi")])
    _, sentences = families.discussion(fam)
    assert any("best final reward is at learning_rate=0.0001 (lo)" in s
               and "the gap between them is unreplicated, so a measurement, not a finding" in s for s in sentences)


def test_cli_rejects_a_run_of_another_variant(tmp_path, capsys):
    _family(tmp_path, {"a": [0.5]})
    with pytest.raises(SystemExit):
        families.main(["--config", str(tmp_path / "c.yaml"), "--family", "fam", "--runs",
                       str(tmp_path / "runs" / "a" / "seed0"), "--variants", "zzz", "--seeds", "0",
                       "--out", str(tmp_path / "o")])
    assert "not in the family" in capsys.readouterr().err


def test_single_seed_or_contended_pair_is_never_a_finding(tmp_path):
    """The page's verdicts are rlpipe.analysis.findings.is_finding's, the main discussion's rule."""
    (tmp_path / "one").mkdir()
    (tmp_path / "busy").mkdir()
    fam = _family(tmp_path / "one", {"a": [0.1], "b": [0.9]}, replicates=1)  # far apart, one seed each
    comps, sentences = families.discussion(fam)
    assert comps[0]["reward_verdict"] == comps[0]["speed_verdict"] == findings.UNREPLICATED
    assert findings.FINDING not in " ".join(sentences)
    fam = _family(tmp_path / "busy", {"a": [0.5] * 3, "b": [0.5] * 3})
    for r, speed in zip(fam.runs, (10.0, 11.0, 12.0, 20.0, 21.0, 22.0), strict=True):
        r.row["samples_per_s"] = speed
        r.row["contended"] = r.variant == "b"
    comps, sentences = families.discussion(fam)
    assert comps[0]["speed_verdict"] == findings.CONTENDED and findings.FINDING not in " ".join(sentences)
    for r in fam.runs:  # control: the same pair timed on a quiet machine is a finding
        r.row["contended"] = False
    assert families.discussion(fam)[0][0]["speed_verdict"] == findings.FINDING


def test_samples_per_s_says_interval_only_where_one_is_shown(tmp_path):
    # one seed each and contended: no interval is printed, so none is announced
    fam = _family(tmp_path, {"a": [0.5], "b": [0.5]})
    fam.runs[0].row["contended"] = True
    _, sentences = families.discussion(fam)
    (speed,) = [s for s in sentences if s.startswith("Samples/s")]
    assert "95%" not in speed and "(one seed each, no interval)" in speed
    # three seeds, quiet: the interval is printed and named
    (tmp_path / "r").mkdir()
    fam = _family(tmp_path / "r", {"a": [0.5] * 3, "b": [0.5] * 3})
    for r, speed in zip(fam.runs, (10.0, 11.0, 12.0, 20.0, 21.0, 22.0), strict=True):
        r.row["samples_per_s"] = speed
    _, sentences = families.discussion(fam)
    assert any(s.startswith("Samples/s relative to a (95% interval): b 1.91x [") for s in sentences)
    fam.runs[0].row["contended"] = True  # replicated but contended: no interval drawn, and said so
    _, sentences = families.discussion(fam)
    (speed,) = [s for s in sentences if s.startswith("Samples/s")]
    assert "95%" not in speed and "no interval" in speed
