"""Replicate statistics (rlpipe.analysis.stats) against values computed by hand."""

import math

import pytest

from rlpipe.analysis.stats import binomial_half_width, mean_ci, ratio_of_means, t975, welch_difference


def test_mean_ci_hand_computed():
    # 0.5, 0.6, 0.7: mean 0.6, sample sd 0.1, se 0.1/sqrt(3), t_{0.975,2} = 4.303
    ci = mean_ci([0.5, 0.6, 0.7])
    assert ci.n == 3 and ci.mean == pytest.approx(0.6)
    assert ci.half == pytest.approx(4.303 * 0.1 / math.sqrt(3), rel=1e-6)
    assert ci.low < 0.5 < 0.7 < ci.high


def test_mean_ci_drops_non_finite_and_marks_single_values():
    assert mean_ci([1.0, math.nan, math.inf]).n == 1
    one = mean_ci([0.4])
    assert one.mean == 0.4 and math.isnan(one.half) and one.fmt() == "0.400 (n=1)"
    assert mean_ci([]).fmt() == "n/a"


def test_t_quantiles_widen_between_table_entries():
    assert t975(1) == pytest.approx(12.706)
    assert t975(35) == t975(30)  # untabulated: the smaller df, a wider interval
    assert t975(1000) == pytest.approx(1.96, abs=1e-3)
    assert math.isnan(t975(0.5))


def test_welch_difference_hand_computed():
    a, b = [0.5, 0.6, 0.7], [0.8, 0.9, 1.0]
    d = welch_difference(a, b)
    # equal variances and sizes: se = sqrt(2 * 0.01 / 3), df = 4, t = 2.776
    assert d.diff == pytest.approx(0.3)
    assert d.half == pytest.approx(2.776 * math.sqrt(2 * 0.01 / 3), rel=1e-6)
    assert d.exceeds  # 0.3 > 0.226
    close = welch_difference(a, [0.55, 0.65, 0.75])
    assert close.decided and not close.exceeds


def test_unreplicated_difference_is_undecided():
    d = welch_difference([0.5], [0.9, 0.8])
    assert d.diff == pytest.approx(0.35) and not d.decided and not d.exceeds


def test_binomial_half_width():
    assert binomial_half_width(0.5, 100) == pytest.approx(1.959964 * 0.05)
    # p = 0 still has a band (the variance is floored at 1/(4n))
    assert binomial_half_width(0.0, 100) > 0
    assert math.isnan(binomial_half_width(0.5, 0))


def test_ratio_of_means_hand_computed():
    """b / a for a = 2, 4 and b = 6, 6, 9 (means 3 and 7): var(log r) = 2/(2*9) + 3/(3*49) = 0.13152,
    Welch df = 0.13152^2 / (0.11111^2 / 1 + 0.02041^2 / 2) = 1.3667 -> t(1) = 12.706."""
    r = ratio_of_means([2.0, 4.0], [6.0, 6.0, 9.0])
    se = math.sqrt(2 / 18 + 3 / 147)
    assert r.ratio == pytest.approx(7 / 3)
    assert r.low == pytest.approx(7 / 3 * math.exp(-12.706 * se))
    assert r.high == pytest.approx(7 / 3 * math.exp(12.706 * se))
    assert r.decided and not r.exceeds  # a wide interval: 2 reference runs
    tight = ratio_of_means([10.0, 10.1, 9.9], [13.0, 13.1, 12.9])
    assert tight.exceeds and tight.low > 1


def test_ratio_of_means_needs_replicates_and_positive_values():
    assert not ratio_of_means([10.0], [12.0, 13.0]).decided
    assert ratio_of_means([10.0], [12.0]).ratio == pytest.approx(1.2)
    assert math.isnan(ratio_of_means([0.0, 1.0], [1.0, 2.0]).ratio)
