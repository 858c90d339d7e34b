"""Expected effects (rlpipe.analysis.expectations): every explanation names a direction and is stated
as shown only when the runs show it; reversed or equal runs get "the data do not show the expected
effect", with the numbers compared at the same step."""

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from rlpipe.analysis import expectations, family_answer
from rlpipe.analysis.expectations import EXPECTATIONS, PREFIX_NOT_SHOWN, PREFIX_SHOWN, Expectation
from rlpipe.analysis.family_data import VAL, Family, Replicate

STEPS = 20


def _nested(key: str, value) -> dict:
    head, _, rest = key.partition(".")
    return {head: _nested(rest, value) if rest else value}


def _metrics(column: str, values: dict[int, float]) -> pd.DataFrame:
    steps = list(range(STEPS + 1))
    return pd.DataFrame({"step": steps, "wall_time": [3.0 * s for s in steps],
                         column: [values.get(s, math.nan) for s in steps]})


def _family(e: Expectation, low_value: float, high_value: float, seeds: int = 1, every=(1, 1)) -> Family:
    """Two variants that differ only in ``e.key``: 'lo' (e.low, or 1) and 'hi' (e.high, or 2), each
    logging ``e.signal`` at a constant value every ``every`` steps (validation reward from step 0)."""
    lo, hi = (e.low, e.high) if e.high is not None else (1, 2)
    fam = Family(name="f", question="q", reference="lo", variants=["lo", "hi"], replicates=seeds,
                 settings={"lo": {"val_every": 10, **_nested(e.key, lo)},
                           "hi": {"val_every": 5, **_nested(e.key, hi)}})  # a cadence key: ignored
    first = 0 if e.signal == VAL else 1
    for v, value, n in (("lo", low_value, every[0]), ("hi", high_value, every[1])):
        for seed in range(seeds):
            m = _metrics(e.signal, {s: value for s in range(first, STEPS + 1) if s % n == 0})
            fam.runs.append(Replicate(v, seed, SimpleNamespace(metrics=m), {}))
    return fam


def _expected_values(e: Expectation) -> tuple[float, float]:
    """(low, high) values in the expected direction."""
    return (0.2, 0.4) if e.raises else (0.4, 0.2)


@pytest.mark.parametrize("e", EXPECTATIONS, ids=lambda e: f"{e.key}-{e.signal}")
def test_every_expectation_is_shown_only_in_its_direction(e):
    lo, hi = _expected_values(e)
    shown = expectations.check(_family(e, lo, hi), e)
    verb = "raises" if e.raises else "lowers"
    assert shown.startswith(PREFIX_SHOWN) and f" {verb} the " in shown and "the data do not show" not in shown
    reversed_ = expectations.check(_family(e, hi, lo), e)
    assert reversed_.startswith(PREFIX_NOT_SHOWN) and "the data do not show the expected effect" in reversed_
    assert f"is expected to {verb[:-1]} the " in reversed_ and " raises the " not in reversed_
    equal = expectations.check(_family(e, 0.3, 0.3 * 1.05), e)  # within the 10% margin: no direction
    assert equal.startswith(PREFIX_NOT_SHOWN)
    assert f"{hi:.3g} vs" in shown and f"vs lo ({e.key} " in shown  # the numbers it compares


def test_a_family_that_does_not_vary_the_setting_gets_no_sentence():
    e = EXPECTATIONS[0]
    fam = _family(e, 0.2, 0.4)
    fam.settings["hi"] = dict(fam.settings["lo"])
    assert expectations.expectation_sentences(fam) == []


def test_kl_penalty_is_compared_at_the_same_step_across_cadences():
    """The kl_drift case: the penalty run logs KL every step, the other every 5th; at step 20 they
    measured 0.126 with and 0.163 without, and the sentence quotes exactly these."""
    e = next(x for x in EXPECTATIONS if x.key == "kl_coef")
    fam = _family(e, 0.0, 0.0, every=(5, 1))
    fam.runs[0].run.metrics.loc[20, e.signal] = 0.163  # without the penalty (kl_coef 1 < 2)
    fam.runs[1].run.metrics[e.signal] = [math.nan] + [0.12] * 19 + [0.126]
    text = expectations.check(fam, e)
    assert text.startswith(PREFIX_SHOWN) and "lowers the KL to reference (k3)" in text
    assert "at step 20, hi (kl_coef 2) 0.126 vs lo (kl_coef 1) 0.163" in text
    assert "one seed each, so not replicated" in text
    fam.runs[1].run.metrics.loc[20, e.signal] = 0.2  # reversed at step 20
    assert expectations.check(fam, e).startswith(PREFIX_NOT_SHOWN)


def test_the_baselines_case_of_the_report_is_not_explained_as_shown():
    """reinforce_with_baseline 0.278 vs no_baseline 0.0854: the run without a baseline has the lower
    grad norm, so 'a missing baseline raises it' must not be stated as shown."""
    e = next(x for x in EXPECTATIONS if x.high == "no_baseline")
    text = expectations.check(_family(e, 0.278, 0.0854, seeds=2), e)
    assert text.startswith(PREFIX_NOT_SHOWN)
    assert "hi (loss_type no_baseline) 0.0854 vs lo (loss_type reinforce_with_baseline) 0.278" in text
    assert "seed means over 2 seeds" in text


def test_answer_carries_the_expectations_and_no_unconditional_since():
    numbers = {"family": "f", "replicates": 1, "variants": {}, "health": {
        "a": {"optim/grad_norm": [0.2, 0.278]}, "b": {"optim/grad_norm": [0.2, 0.0854]}},
        "sentences": ["x", f"{PREFIX_NOT_SHOWN} y.", f"{PREFIX_SHOWN} z."]}
    text = family_answer.answer(numbers)
    assert f"{PREFIX_NOT_SHOWN} y." in text and f"{PREFIX_SHOWN} z." in text and "x" not in text
    assert not any("since" in s for s in text)


def test_a_grad_norm_collapsing_to_zero_is_noticed():
    health = {"r1_zero": {"optim/grad_norm": [1.2, 1.0]},
              "question_only": {"optim/grad_norm": [1.06, 0.0], "reward/zero_std_frac": [0.5, 1.0]}}
    text = family_answer.stalled_sentence({"health": health})
    assert text.startswith("question_only's grad norm collapsed from 1.06 to 0") and "learning stopped" in text
    assert "r1_zero" not in text
    health["question_only"]["optim/grad_norm"] = [1.06, 0.5]
    assert family_answer.stalled_sentence({"health": health}) is None


def test_main_kl_section_compares_the_penalty_at_one_step():
    """The systems runs' KL section: the run without the penalty logs KL every 5th step and its last
    point (step 15) is not the penalty run's last (step 18); both are compared at step 15."""
    from rlpipe.analysis import kl_text
    rows = [{"variant": "kl_penalty", "step": s, "kl/ref_k3": 0.01 * s} for s in range(1, 19)]
    rows += [{"variant": "onpolicy", "step": s, "kl/ref_k3": 0.02 * s} for s in (5, 10, 15)]
    metrics = pd.DataFrame(rows)
    pen = {"variant": "kl_penalty", "kl_coef": 0.05, "val_reward_final": 0.5}
    base = {"variant": "onpolicy", "kl_coef": 0.0, "val_reward_final": 0.5}
    text = kl_text.penalty_sentence(metrics, pen, base)
    assert "(kl/ref_k3) at step 15, the last step both runs measured, is 0.15 vs 0.3 without ('onpolicy'): " \
           "lower" in text
    metrics.loc[metrics["variant"] == "kl_penalty", "kl/ref_k3"] *= 3  # reversed: 0.45 vs 0.3
    text = kl_text.penalty_sentence(metrics, pen, base)
    assert "is 0.45 vs 0.3 without" in text and "the data do not show the expected effect of the penalty" in text


def test_prompt_explanation_is_only_for_our_own_base_model():
    e = next(x for x in EXPECTATIONS if x.key == "math.prompt")
    fam = _family(e, 0.4, 0.1)
    assert expectations.check(fam, e).startswith(PREFIX_SHOWN) and "never wrote" in expectations.check(fam, e)
    for v in fam.settings.values():
        v["math"]["base_model_dir"] = "/models/qwen"  # a pretrained HF model: the why does not hold
    assert expectations.check(fam, e) is None


def test_a_collapse_without_tied_groups_says_it_explains_only_part():
    health = {"v": {"optim/grad_norm": [1.0, 0.001], "reward/zero_std_frac": [0.2, 0.5]}}
    text = family_answer.stalled_sentence({"health": health})
    assert "zero-std group fraction ended at 0.50, so that explains only part of it" in text
    assert "learning stopped" not in text
