"""The flat-reward diagnosis (rlpipe.analysis.flat_reward) on constructed runs: one per cause, a
run whose reward rose (no diagnosis), and the hooks that print it (aggregate, trainer log line)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rlpipe.analysis import flat_reward

STEPS = 32
VAL_SIZE = 256


def run(val=None, **signals) -> pd.DataFrame:
    """A run of STEPS steps, validated every 4, whose signals are healthy unless given: each
    keyword is a metrics column (slashes as '__') set to a constant or a per-step array."""
    steps = np.arange(STEPS + 1)
    healthy = {"reward/train_mean": 0.5, "reward/zero_std_frac": 0.1, "policy/entropy": 1.0,
               "loss/clip_frac": 0.02, "kl/prev_k3": 1e-3, "kl/ref_k3": 0.01}
    healthy.update({k.replace("__", "/"): v for k, v in signals.items()})
    df = pd.DataFrame({"step": steps})
    for name, value in healthy.items():
        df[name] = np.broadcast_to(np.asarray(value, dtype=float), steps.shape).copy()
        df.loc[0, name] = math.nan  # step 0: validation only
    flat_val = [0.50, 0.51, 0.49, 0.50, 0.51, 0.50, 0.49, 0.50, 0.51]
    values = flat_val if val is None else val
    df["reward/val_mean"] = math.nan
    df.loc[df["step"] % 4 == 0, "reward/val_mean"] = values
    return df


def test_a_rising_run_gets_no_diagnosis():
    rising = [0.20, 0.28, 0.35, 0.41, 0.47, 0.52, 0.55, 0.58, 0.60]
    assert flat_reward.diagnose(run(val=rising), VAL_SIZE) is None
    # the same signals on a flat curve: a diagnosis (so the rising run's None is the curve's doing)
    assert flat_reward.diagnose(run(), VAL_SIZE) is not None


def test_a_rise_within_the_noise_is_flat_and_beyond_it_is_not():
    # 0.577 -> 0.563..0.593 over 512 prompts (the digit-sum run): noise ~0.04, so flat
    digit_sum = [0.577, 0.563, 0.593, 0.571, 0.585, 0.580, 0.569, 0.590, 0.575]
    d = flat_reward.diagnose(run(val=digit_sum), 512)
    assert d is not None and abs(d.rise) < d.noise
    assert 0.02 < d.noise < 0.06
    # +0.1 over 512 prompts is well beyond it
    assert flat_reward.diagnose(run(val=[0.5, *[0.6] * 8]), 512) is None


CASES = {
    "saturated_0": dict(reward__train_mean=0.01, val=[0.01, 0.0, 0.02, 0.01, 0.0, 0.01, 0.02, 0.01, 0.0]),
    "saturated_1": dict(reward__train_mean=0.98, val=[0.98, 0.99, 0.97, 0.98, 0.99, 0.98, 0.97, 0.98, 0.99]),
    "entropy": dict(policy__entropy=np.linspace(1.2, 0.02, STEPS + 1)),
    "zero_std": dict(reward__zero_std_frac=0.8),
    "clip": dict(loss__clip_frac=0.35),
    "lr_small": dict(kl__prev_k3=1e-7, kl__ref_k3=np.linspace(0, 5e-6, STEPS + 1)),
    "kl_drift": dict(kl__ref_k3=np.linspace(0, 0.4, STEPS + 1)),
}


@pytest.mark.parametrize("cause", list(CASES))
def test_each_cause_is_named_with_its_numbers(cause):
    d = flat_reward.diagnose(run(**CASES[cause]), VAL_SIZE)
    assert d is not None, cause
    assert d.cause == cause, [c.name for c in d.causes]
    text = d.sentence("wordrev/onpolicy")
    assert "wordrev/onpolicy" in text and "Try:" in text
    assert any(ch.isdigit() for ch in d.causes[0].evidence)


def test_healthy_signals_on_a_flat_curve_say_none_explains_it():
    d = flat_reward.diagnose(run(), VAL_SIZE)
    assert d.causes == [] and d.cause == "unexplained"
    assert "None of the signals" in d.sentence()


def test_collapse_is_named_before_its_consequences():
    # a collapsed policy also gives identical rewards: entropy first, zero_std as "also"
    d = flat_reward.diagnose(run(policy__entropy=np.linspace(1.0, 0.01, STEPS + 1), reward__zero_std_frac=0.9),
                             VAL_SIZE)
    assert [c.name for c in d.causes] == ["entropy", "zero_std"]
    assert "Also:" in d.sentence()


def test_without_val_size_the_noise_comes_from_the_curve():
    assert flat_reward.diagnose(run(), None) is not None
    assert flat_reward.diagnose(run(val=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]), None) is None
    two_points = run().loc[lambda df: df["step"].isin([0, 32]) | df["reward/val_mean"].isna()]
    assert flat_reward.diagnose(two_points, None) is None  # two points and no val_size: cannot judge


def test_log_line():
    assert flat_reward.log_line(run(reward__zero_std_frac=0.8), VAL_SIZE, "v").startswith("flat reward: ")
    assert flat_reward.log_line(run(val=[0.2, *[0.6] * 8]), VAL_SIZE, "v") is None


def test_results_page_section_names_each_flat_run(tmp_path):
    import json

    import yaml

    from rlpipe import contract
    from rlpipe.analysis import results_page

    for rel, frame in (("runs/flat", run(reward__zero_std_frac=0.8)), ("families/f/runs/v/seed0", run()),
                       ("tracks/t/runs/up", run(val=[0.2, 0.3, 0.4, 0.5, 0.6, 0.6, 0.7, 0.7, 0.8]))):
        d = tmp_path / rel
        d.mkdir(parents=True)
        frame.to_parquet(d / contract.METRICS_FILE, index=False)
        (d / contract.RUN_INFO_FILE).write_text(json.dumps({"finished": True}))
        (d / contract.RUN_CONFIG_FILE).write_text(yaml.safe_dump({"train": {"val_size": VAL_SIZE}}))
    lines = flat_reward.results_section(tmp_path)
    assert lines[0] == "## Flat rewards"
    text = "\n".join(lines)
    assert "`runs/flat`" in text and "80% of the groups" in text and "`families/f/runs/v/seed0`" in text
    assert "tracks/t/runs/up" not in text
    assert "## Flat rewards" in results_page.render(tmp_path)
    (tmp_path / "runs").joinpath("flat", contract.METRICS_FILE).unlink()
    (tmp_path / "families").joinpath("f/runs/v/seed0", contract.METRICS_FILE).unlink()
    assert flat_reward.results_section(tmp_path) == []


# --------------------------------------------------------------------- two signals at once: the ranking


def names(d) -> list[str]:
    return [c.name for c in d.causes]


def test_a_learning_rate_too_small_outranks_a_marginal_zero_variance_signal():
    # KL 1e-9 per step is four orders below what 55% zero-variance groups can explain (a KL shrunk by
    # at most (1 - 0.55)^2): the learning rate is the cause, the groups an "also"
    d = flat_reward.diagnose(run(kl__prev_k3=1e-9, kl__ref_k3=np.linspace(0, 1e-8, STEPS + 1),
                                 reward__zero_std_frac=0.55), VAL_SIZE)
    assert names(d) == ["lr_small", "zero_std"]
    assert d.sentence().split("Likely cause: ")[1].startswith("the updates barely moved")


def test_zero_variance_groups_that_explain_a_still_policy_leave_no_learning_rate_cause():
    # 99% identical groups shrink the update 100x, its KL up to 1e4x: a KL of 1e-8 is what they explain
    d = flat_reward.diagnose(run(kl__prev_k3=1e-8, kl__ref_k3=np.linspace(0, 1e-7, STEPS + 1),
                                 reward__zero_std_frac=0.99), VAL_SIZE)
    assert names(d) == ["zero_std"]


def test_a_strong_signal_outranks_a_marginal_one_whatever_the_table_order():
    d = flat_reward.diagnose(run(loss__clip_frac=0.9, reward__zero_std_frac=0.52), VAL_SIZE)
    assert names(d) == ["clip", "zero_std"]
    d = flat_reward.diagnose(run(loss__clip_frac=0.21, reward__zero_std_frac=0.95), VAL_SIZE)
    assert names(d) == ["zero_std", "clip"]


def _write_run(d, frame, lr):
    import json

    import yaml

    from rlpipe import contract

    d.mkdir(parents=True)
    frame.to_parquet(d / contract.METRICS_FILE, index=False)
    (d / contract.RUN_INFO_FILE).write_text(json.dumps({"finished": True}))
    (d / contract.RUN_CONFIG_FILE).write_text(yaml.safe_dump({"train": {"val_size": VAL_SIZE,
                                                                        "learning_rate": lr}}))


def test_a_small_kl_beside_a_peer_that_moved_further_and_learned_is_a_small_learning_rate(tmp_path):
    # the lr sweep: lr3e-5 ends at KL 0.054 (just past the drift threshold) and stays flat; lr1e-4
    # moves 5x further and its reward rises. The policy at 3e-5 barely moved: the learning rate, not a drift
    runs = tmp_path / "families" / "lr_sweep" / "runs"
    _write_run(runs / "lr3e-5" / "seed0", run(kl__prev_k3=2e-4, kl__ref_k3=np.linspace(0, 0.054, STEPS + 1)), 3e-5)
    _write_run(runs / "lr1e-4" / "seed0", run(kl__prev_k3=1e-3, kl__ref_k3=np.linspace(0, 0.29, STEPS + 1),
                                              val=[0.2, 0.3, 0.4, 0.5, 0.6, 0.6, 0.7, 0.7, 0.8]), 1e-4)
    text = "\n".join(flat_reward.results_section(tmp_path))
    line = next(ln for ln in text.splitlines() if "lr3e-5" in ln)
    cause = line.split("Likely cause: ")[1]
    assert cause.startswith("the learning rate was too small"), line
    assert "0.054" in cause and "0.290" in cause and "5.4x further" in cause
    assert "drifted" in line.split("Also: ")[1]  # still said, as the weaker reading
    # alone (the trainer's log line: no peers) the same run reads as a drift, with its number
    assert "drifted from the reference (final KL 0.054)" in flat_reward.run_log_line(runs / "lr3e-5" / "seed0", "v")
