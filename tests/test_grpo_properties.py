"""Hypothesis property tests for rlpipe.grpo: invariants that must hold for any input."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpipe import grpo
from rlpipe.grpo import (
    compute_advantages,
    compute_grpo_clip_loss,
    compute_grpo_no_clip_loss,
    grpo_microbatch_train_step,
    masked_kl,
    masked_mean,
    masked_mean_or_zero,
    masked_normalize,
)

SETTINGS = settings(max_examples=40, deadline=None)
finite = st.floats(-10, 10, allow_nan=False, width=32)


@st.composite
def grouped_rewards(draw):
    group_size = draw(st.integers(1, 6))
    n_groups = draw(st.integers(1, 4))
    values = draw(st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, -3.0]) | finite,
                           min_size=group_size * n_groups, max_size=group_size * n_groups))
    return torch.tensor(values, dtype=torch.float32), group_size


@st.composite
def batch(draw, loss_type=None):
    """Random (B, T) log-probs, masks (rows may be all zero), per-row advantages/rewards, old/ref."""
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(b, t, generator=g) * 3  # (B, T) valid log-probs
    return dict(
        policy_log_probs=lp,
        old_log_probs=lp + 0.3 * torch.randn(b, t, generator=g),
        ref_log_probs=lp + 0.3 * torch.randn(b, t, generator=g),
        response_mask=torch.rand(b, t, generator=g) < 0.6,
        advantages=torch.randn(b, 1, generator=g),
        raw_rewards=torch.rand(b, 1, generator=g) * 2,
        loss_type=loss_type or draw(st.sampled_from(grpo.LOSS_TYPES)),
        cliprange=draw(st.sampled_from([0.05, 0.2, 0.5])),
        gas=draw(st.integers(1, 4)),
        kl_coef=draw(st.sampled_from([0.0, 0.1])),
        length_normalization=draw(st.sampled_from(list(grpo.LENGTH_NORMALIZATIONS))),
        normalize_constant=float(draw(st.integers(1, 8))),
    )


def _step(d, policy_log_probs, **overrides):
    args = {**d, **overrides}
    return grpo_microbatch_train_step(
        policy_log_probs, args["response_mask"], args["gas"], args["loss_type"], raw_rewards=args["raw_rewards"],
        advantages=args["advantages"], old_log_probs=args["old_log_probs"], cliprange=args["cliprange"],
        length_normalization=args["length_normalization"], normalize_constant=args["normalize_constant"],
        ref_log_probs=args["ref_log_probs"], kl_coef=args["kl_coef"])


@SETTINGS
@given(grouped_rewards(), st.sampled_from(["centered_rewards", "normalized_rewards"]))
def test_advantages_sum_to_zero_within_each_group(rg, mode):
    rewards, group_size = rg
    adv = compute_advantages(rewards, group_size, mode, 1e-6).reshape(-1, group_size)
    scale = 1.0 + adv.abs().max().item()
    assert torch.all(adv.sum(dim=-1).abs() <= 1e-4 * scale * group_size)
    assert torch.isfinite(adv).all()


@SETTINGS
@given(grouped_rewards())
def test_normalized_is_centered_over_std_plus_eps(rg):
    rewards, group_size = rg
    centered = compute_advantages(rewards, group_size, "centered_rewards", 0.0).reshape(-1, group_size)
    normalized = compute_advantages(rewards, group_size, "normalized_rewards", 1e-3).reshape(-1, group_size)
    if group_size > 1:
        std = rewards.reshape(-1, group_size).std(dim=-1, keepdim=True)
        torch.testing.assert_close(normalized, centered / (std + 1e-3), atol=1e-4, rtol=1e-4)


@SETTINGS
@given(batch())
def test_clip_equals_no_clip_when_cliprange_is_huge(d):
    clip, _ = compute_grpo_clip_loss(d["advantages"], d["policy_log_probs"], d["old_log_probs"], 1e9)
    no_clip, _ = compute_grpo_no_clip_loss(d["advantages"], d["policy_log_probs"], d["old_log_probs"])
    assert torch.equal(clip, no_clip)


@SETTINGS
@given(batch())
def test_clip_fraction_is_zero_when_ratios_are_one(d):
    lp = d["policy_log_probs"]
    _, meta = compute_grpo_clip_loss(d["advantages"], lp, lp.clone(), d["cliprange"])
    assert meta["loss/clip_frac"].item() == 0.0 and not meta["loss/clipped_mask"].any()


@SETTINGS
@given(batch())
def test_clipped_loss_is_never_below_unclipped(d):
    # -min(rA, clip(r)A) >= -rA: clipping only ever removes incentive (pessimistic bound).
    clip, _ = compute_grpo_clip_loss(d["advantages"], d["policy_log_probs"], d["old_log_probs"], d["cliprange"])
    no_clip, _ = compute_grpo_no_clip_loss(d["advantages"], d["policy_log_probs"], d["old_log_probs"])
    assert torch.all(clip >= no_clip - 1e-6)


def _written_formula(d, lp):
    """The train-step loss written out directly from the seed formulas (clean inputs, mask as 0/1)."""
    m = d["response_mask"].float()
    a, old = d["advantages"], d["old_log_probs"]
    ratio = torch.exp(lp - old)
    per_token = {
        "no_baseline": -d["raw_rewards"] * lp,
        "reinforce_with_baseline": -a * lp,
        "grpo_no_clip": -ratio * a,
        "grpo_clip": -torch.minimum(ratio * a, torch.clamp(ratio, 1 - d["cliprange"], 1 + d["cliprange"]) * a),
    }[d["loss_type"]]
    log_r = d["ref_log_probs"] - lp
    per_token = per_token + d["kl_coef"] * (torch.exp(log_r) - log_r - 1)
    if d["length_normalization"] == "masked_mean":
        rows = (per_token * m).sum(1) / m.sum(1).clamp(min=1)
    else:
        rows = (per_token * m).sum(1) / d["normalize_constant"]
    return rows.mean() / d["gas"]


@SETTINGS
@given(batch())
def test_train_step_gradient_matches_written_formula(d):
    lp = d["policy_log_probs"].clone().requires_grad_(True)
    loss, _ = _step(d, lp)
    ref_lp = d["policy_log_probs"].clone().requires_grad_(True)
    expected = _written_formula(d, ref_lp)
    expected.backward()
    torch.testing.assert_close(loss, expected.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lp.grad, ref_lp.grad, atol=1e-5, rtol=1e-5)


POISON = [float("nan"), float("inf"), -float("inf")]


@SETTINGS
@given(batch(), st.sampled_from(POISON), st.sampled_from(POISON))
def test_masked_positions_never_change_results(d, bad, bad_old):
    keep = d["response_mask"]

    def poisoned(x, value):
        return torch.where(keep, x, torch.full_like(x, value))

    clean_lp = d["policy_log_probs"].clone().requires_grad_(True)
    clean_loss, clean_meta = _step(d, clean_lp)
    dirty_lp = poisoned(d["policy_log_probs"], bad).requires_grad_(True)
    dirty_loss, dirty_meta = _step(d, dirty_lp, old_log_probs=poisoned(d["old_log_probs"], bad_old),
                                   ref_log_probs=poisoned(d["ref_log_probs"], bad))
    assert torch.isfinite(dirty_loss) and torch.isfinite(dirty_lp.grad).all()
    torch.testing.assert_close(dirty_loss, clean_loss)
    torch.testing.assert_close(dirty_lp.grad, clean_lp.grad)
    assert torch.all(dirty_lp.grad[~keep] == 0)
    for key in ("loss/clip_frac", "loss/ratio_mean", "kl/ref_k3", "loss/policy"):
        if key in clean_meta:
            torch.testing.assert_close(dirty_meta[key], clean_meta[key])


@SETTINGS
@given(batch(), st.sampled_from(POISON), st.sampled_from([None, 0, 1]))
def test_masked_reductions_ignore_masked_values(d, bad, dim):
    keep, x = d["response_mask"], d["policy_log_probs"]
    dirty = torch.where(keep, x, torch.full_like(x, bad))
    # masked_mean is NaN where nothing is selected (seed semantics), in both; compare NaN as equal.
    torch.testing.assert_close(masked_mean(dirty, keep, dim), masked_mean(x, keep, dim), equal_nan=True)
    torch.testing.assert_close(masked_mean_or_zero(dirty, keep, dim), masked_mean_or_zero(x, keep, dim))
    torch.testing.assert_close(masked_normalize(dirty, keep, 3.0, dim), masked_normalize(x, keep, 3.0, dim))
    for est in grpo.KL_ESTIMATORS:
        for red in grpo.KL_REDUCTIONS:
            torch.testing.assert_close(masked_kl(dirty, d["ref_log_probs"], keep, est, red),
                                       masked_kl(x, d["ref_log_probs"], keep, est, red))
    assert torch.isfinite(masked_mean_or_zero(dirty, keep, dim)).all()
    assert torch.isfinite(masked_normalize(dirty, keep, 3.0, dim)).all()


def _selected_count(keep, dim):
    return keep.sum() if dim is None else keep.sum(dim)


@SETTINGS
@given(batch(), st.sampled_from([None, 0, 1]))
def test_masked_mean_matches_naive_formula(d, dim):
    """Equal to sum(x * m) / sum(m) where at least one element is selected; NaN exactly where none is."""
    keep, x = d["response_mask"], d["policy_log_probs"]
    m = keep.float()
    naive = (x * m).sum() / m.sum() if dim is None else (x * m).sum(dim) / m.sum(dim)
    got = masked_mean(x, keep, dim)
    assert got.shape == (x.mean() if dim is None else x.mean(dim)).shape
    has = _selected_count(keep, dim) > 0
    torch.testing.assert_close(got[has], naive[has])
    assert torch.equal(torch.isnan(got), ~has)


@SETTINGS
@given(batch(), st.sampled_from([None, 0, 1]))
def test_masked_mean_or_zero_is_masked_mean_with_empty_slices_zeroed(d, dim):
    keep, x = d["response_mask"], d["policy_log_probs"]
    has = _selected_count(keep, dim) > 0
    expected = torch.where(has, masked_mean(x, keep, dim), torch.zeros(()))
    got = masked_mean_or_zero(x, keep, dim)
    torch.testing.assert_close(got, expected)
    assert torch.all(got[~has] == 0) and torch.isfinite(got).all()
