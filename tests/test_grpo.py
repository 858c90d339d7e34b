"""Hand-computed values for rlpipe.grpo (numbers worked out from seed 000/001/003/004 formulas)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from rlpipe import grpo
from rlpipe.grpo import (
    compute_advantages,
    compute_entropy,
    compute_group_normalized_rewards,
    compute_grpo_clip_loss,
    compute_grpo_no_clip_loss,
    compute_naive_policy_gradient_loss,
    compute_policy_gradient_loss,
    entropy_from_log_probs,
    get_response_log_probs,
    grpo_microbatch_train_step,
    masked_kl,
    masked_mean,
    masked_mean_or_zero,
    masked_normalize,
    pack_response_values,
    pack_token_ids,
    tokenize_prompt_and_output,
)

LN = math.log


def close(actual, expected, atol=1e-5, equal_nan=False):
    torch.testing.assert_close(torch.as_tensor(actual).float(), torch.as_tensor(expected).float(),
                               atol=atol, rtol=1e-5, equal_nan=equal_nan)


# --------------------------------------------------------------------------- seed-004 worked example


def test_seed_004_length_normalization_worked_example():
    # Verbatim from seed 004 "Length normalization" (float32 version), incl. the constant_normalizer spelling.
    ratio = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], requires_grad=True, dtype=torch.float32)
    advs = torch.tensor([[2, 2, 2, 2, 2, 2, 2], [2, 2, 2, 2, 2, 2, 2]], dtype=torch.float32)
    masks = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    max_gen_len = 7
    masked_mean_result = masked_mean(ratio * advs, masks, dim=1)
    masked_normalize_result = masked_normalize(ratio * advs, masks, dim=1, constant_normalizer=max_gen_len)
    close(masked_mean_result, [2.0, 2.0])
    close(masked_normalize_result, [1.1429, 2.0000], atol=1e-4)
    masked_mean_result.mean().backward()
    close(ratio.grad, [[0.25] * 4 + [0.0] * 3, [0.1429] * 7], atol=1e-4)
    ratio.grad.zero_()
    masked_normalize_result.mean().backward()
    close(ratio.grad, [[0.1429] * 4 + [0.0] * 3, [0.1429] * 7], atol=1e-4)


# --------------------------------------------------------------------------- advantages


def _exact_match_reward(response: str, truth: str) -> dict[str, float]:
    hit = float(response == truth)
    return {"reward": hit, "format_reward": 1.0, "answer_reward": hit}


RESPONSES = ["a", "b", "b", "a", "c", "c", "c", "c"]
TRUTHS = ["a"] * 4 + ["c"] * 4  # rewards [1, 0, 0, 1 | 1, 1, 1, 1]


def test_group_normalized_rewards_eq1_with_bessel_std():
    adv, raw, meta = compute_group_normalized_rewards(_exact_match_reward, RESPONSES, TRUTHS, 4, 1e-6, True)
    close(raw, [1, 0, 0, 1, 1, 1, 1, 1])
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.5773503; group 2 ties -> 0
    a = 0.5 / (0.5773503 + 1e-6)
    close(adv, [a, -a, -a, a, 0, 0, 0, 0])
    close(a, 0.8660239, atol=1e-6)
    # batch: mean 0.75, unbiased std sqrt((6 * 0.0625 + 2 * 0.5625) / 7) = 0.4629100
    assert meta["reward/mean"] == pytest.approx(0.75)
    assert meta["reward/std"] == pytest.approx(0.4629100, abs=1e-6)
    assert (meta["reward/min"], meta["reward/max"]) == (0.0, 1.0)
    assert meta["reward/zero_std_frac"] == 0.5
    assert meta["reward/format_reward"] == 1.0 and meta["reward/answer_reward"] == 0.75


def test_group_normalized_rewards_dr_grpo_eq4():
    adv, _, _ = compute_group_normalized_rewards(_exact_match_reward, RESPONSES, TRUTHS, 4, 1e-6, False)
    close(adv, [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])


@pytest.mark.parametrize("kwargs, match", [
    (dict(rollout_responses=RESPONSES[:7], repeated_ground_truths=TRUTHS[:7]), "multiple of group_size"),
    (dict(rollout_responses=RESPONSES, repeated_ground_truths=TRUTHS[:7]), "repeated_ground_truths"),
    (dict(group_size=0), "group_size"),
    (dict(reward_fn=lambda r, t: 1.0), "'reward'"),
])
def test_group_normalized_rewards_rejects_bad_input(kwargs, match):
    args = dict(reward_fn=_exact_match_reward, rollout_responses=RESPONSES, repeated_ground_truths=TRUTHS,
                group_size=4, advantage_eps=1e-6, normalize_by_std=True)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        compute_group_normalized_rewards(**args)


REWARDS = torch.tensor([1.0, 3.0, 3.0, 2.0, 2.0, 2.0, 2.0, 2.0])  # two groups of 4; the second ties


@pytest.mark.parametrize("mode, expected", [
    ("rewards", [1, 3, 3, 2, 2, 2, 2, 2]),
    # mean 2.25
    ("centered_rewards", [-1.25, 0.75, 0.75, -0.25, 0, 0, 0, 0]),
    # unbiased std sqrt((1.5625 + 0.5625 + 0.5625 + 0.0625) / 3) = 0.9574271
    ("normalized_rewards", [-1.3055824, 0.7833495, 0.7833495, -0.2611165, 0, 0, 0, 0]),
    # seed 003 code: the reward where it equals its group's max, else 0
    ("max_rewards", [0, 3, 3, 0, 2, 2, 2, 2]),
])
def test_compute_advantages_seed_003_delta_modes(mode, expected):
    close(compute_advantages(REWARDS, 4, mode, 0.0), expected)


def test_tied_group_gets_exactly_zero_despite_float_roundoff():
    # float32 mean of seven 0.1s differs from 0.1 by 7e-9; divided by (0 + 1e-8) that would be ~0.4.
    rewards = torch.full((7,), 0.1)
    assert torch.equal(compute_advantages(rewards, 7, "normalized_rewards", 1e-8), torch.zeros(7))
    assert torch.equal(compute_advantages(rewards, 7, "centered_rewards", 0.0), torch.zeros(7))


def test_group_of_one_gives_zero_advantage_without_nan():
    adv = compute_advantages(torch.tensor([1.0, 5.0]), 1, "normalized_rewards", 1e-6)
    assert torch.equal(adv, torch.zeros(2))


@pytest.mark.parametrize("rewards, group_size, mode, match", [
    (torch.ones(6), 4, "centered_rewards", "divisible"),
    (torch.ones(2, 2), 2, "centered_rewards", r"shape \(B,\)"),
    (torch.tensor([1.0, float("nan")]), 2, "centered_rewards", r"raw_rewards\[1\]"),
    (torch.ones(4), 2, "z_scores", "unknown advantage mode 'z_scores'"),
])
def test_compute_advantages_rejects_bad_input(rewards, group_size, mode, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages(rewards, group_size, mode, 1e-6)


# --------------------------------------------------------------------------- per-token losses

ADV = torch.tensor([[1.0], [-1.0]])
# ratios [[1.5, 0.9], [0.5, 1.1]] against old log-probs 0
POLICY = torch.log(torch.tensor([[1.5, 0.9], [0.5, 1.1]]))
OLD = torch.zeros(2, 2)


def test_naive_policy_gradient_loss():
    loss = compute_naive_policy_gradient_loss(torch.tensor([[2.0], [-1.0]]), torch.tensor([[-1.0, -2.0], [-0.5, 0.0]]))
    close(loss, [[2.0, 4.0], [-0.5, 0.0]])
    loss = compute_naive_policy_gradient_loss(torch.tensor([2.0, -1.0]), torch.tensor([[-1.0, -2.0], [-0.5, 0.0]]))
    close(loss, [[2.0, 4.0], [-0.5, 0.0]])  # (B,) broadcasts like (B, 1)


def test_grpo_clip_loss_eq6():
    loss, meta = compute_grpo_clip_loss(ADV, POLICY, OLD, 0.2)
    # A=+1: r=1.5 -> min(1.5, 1.2) = 1.2 (clipped); r=0.9 -> 0.9
    # A=-1: r=0.5 -> min(-0.5, -0.8) = -0.8 (clipped); r=1.1 -> -1.1
    close(loss, [[-1.2, -0.9], [0.8, 1.1]])
    assert meta["loss/clipped_mask"].tolist() == [[True, False], [True, False]]
    close(meta["loss/clip_frac"], 0.5)


def test_grpo_no_clip_loss_seed_004():
    loss, meta = compute_grpo_no_clip_loss(ADV, POLICY, OLD)
    close(loss, [[-1.5, -0.9], [0.5, 1.1]])
    close(meta["loss/ratio"], [[1.5, 0.9], [0.5, 1.1]])


def test_old_log_probs_get_no_gradient():
    policy = POLICY.clone().requires_grad_(True)
    old = OLD.clone().requires_grad_(True)
    for loss in (compute_grpo_clip_loss(ADV, policy, old, 0.2)[0], compute_grpo_no_clip_loss(ADV, policy, old)[0]):
        loss.sum().backward()
    assert old.grad is None and policy.grad is not None


def test_policy_gradient_loss_dispatches_to_each_loss():
    raw = torch.tensor([[2.0], [0.0]])
    cases = {
        "no_baseline": compute_naive_policy_gradient_loss(raw, POLICY),
        "reinforce_with_baseline": compute_naive_policy_gradient_loss(ADV, POLICY),
        "grpo_clip": compute_grpo_clip_loss(ADV, POLICY, OLD, 0.2)[0],
        "grpo_no_clip": compute_grpo_no_clip_loss(ADV, POLICY, OLD)[0],
    }
    assert set(cases) == set(grpo.LOSS_TYPES)
    for loss_type, expected in cases.items():
        loss, _ = compute_policy_gradient_loss(POLICY, loss_type, raw_rewards=raw, advantages=ADV,
                                               old_log_probs=OLD, cliprange=0.2)
        close(loss, expected)


REQUIRED = {
    "no_baseline": ["raw_rewards"],
    "reinforce_with_baseline": ["advantages"],
    "grpo_clip": ["advantages", "old_log_probs", "cliprange"],
    "grpo_no_clip": ["advantages", "old_log_probs"],
}


@pytest.mark.parametrize("loss_type, missing", [(k, a) for k, args in REQUIRED.items() for a in args])
def test_missing_argument_is_named(loss_type, missing):
    kwargs = dict(raw_rewards=ADV, advantages=ADV, old_log_probs=OLD, cliprange=0.2)
    kwargs[missing] = None
    with pytest.raises(ValueError, match=f"{loss_type}.*requires {missing}"):
        compute_policy_gradient_loss(POLICY, loss_type, **kwargs)
    with pytest.raises(ValueError, match=f"requires {missing}"):
        grpo_microbatch_train_step(POLICY.clone().requires_grad_(True), torch.ones(2, 2), 1, loss_type, **kwargs)


def test_unknown_loss_type_lists_valid_ones():
    with pytest.raises(ValueError, match="'ppo'.*no_baseline.*reinforce_with_baseline.*grpo_clip.*grpo_no_clip"):
        compute_policy_gradient_loss(POLICY, "ppo", advantages=ADV)


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="advantages must have shape"):
        compute_grpo_no_clip_loss(torch.ones(3, 1), POLICY, OLD)
    with pytest.raises(ValueError, match="old_log_probs shape"):
        compute_grpo_clip_loss(ADV, POLICY, torch.zeros(2, 3), 0.2)
    with pytest.raises(ValueError, match="ref_log_probs shape"):
        grpo_microbatch_train_step(POLICY.clone().requires_grad_(True), torch.ones(2, 2), 1, "grpo_no_clip",
                                   advantages=ADV, old_log_probs=OLD, ref_log_probs=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="response_mask shape"):
        grpo_microbatch_train_step(POLICY.clone().requires_grad_(True), torch.ones(2, 3), 1, "grpo_no_clip",
                                   advantages=ADV, old_log_probs=OLD)


# --------------------------------------------------------------------------- masked reductions

T6 = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M6 = torch.tensor([[1, 1, 0], [0, 0, 0]])


NAN = float("nan")


def test_masked_mean_hand_values_and_empty_rows():
    # Seed 001 Problem 6: tensor.mean(dim) semantics, so a slice with nothing selected is NaN,
    # like torch's mean of an empty set.
    close(masked_mean(T6, M6, dim=1), [1.5, NAN], equal_nan=True)  # (1 + 2) / 2; row 1 selects nothing
    close(masked_mean(T6, M6, dim=0), [1.0, 2.0, NAN], equal_nan=True)  # column 2 selects nothing
    close(masked_mean(T6, M6, dim=-1), [1.5, NAN], equal_nan=True)
    close(masked_mean(T6, M6), 1.5)
    close(masked_mean(T6, M6.bool()), 1.5)
    assert torch.isnan(masked_mean(T6, torch.zeros(2, 3)))
    assert torch.isnan(torch.empty(0).mean())  # the semantics it follows
    # Shapes are those of tensor.mean(dim); with every element selected it *is* tensor.mean(dim).
    ones = torch.ones(2, 3)
    for dim in (None, 0, 1):
        close(masked_mean(T6, ones, dim), T6.mean() if dim is None else T6.mean(dim))
        assert masked_mean(T6, M6, dim).shape == (T6.mean() if dim is None else T6.mean(dim)).shape


def test_masked_mean_empty_row_keeps_other_rows_gradient_finite():
    x = T6.clone().requires_grad_(True)
    out = masked_mean(x, M6, dim=1)
    out[0].backward()  # the NaN of the empty row does not leak into the selected row's gradient
    close(x.grad, [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])


def test_masked_mean_or_zero_hand_values():
    # The loss-safe variant: the same where something is selected, 0 (not NaN) where nothing is.
    close(masked_mean_or_zero(T6, M6, dim=1), [1.5, 0.0])
    close(masked_mean_or_zero(T6, M6, dim=0), [1.0, 2.0, 0.0])
    close(masked_mean_or_zero(T6, M6), 1.5)
    close(masked_mean_or_zero(T6, torch.zeros(2, 3)), 0.0)
    with pytest.raises(ValueError, match="does not broadcast"):
        masked_mean_or_zero(T6, torch.ones(4))


def test_masked_mean_or_zero_all_masked_row_contributes_zero_and_finite_grad():
    poisoned = torch.tensor([[1.0, 2.0, NAN], [float("inf"), NAN, -float("inf")]], requires_grad=True)
    rows = masked_mean_or_zero(poisoned, M6, dim=1)  # (B,)
    close(rows, [1.5, 0.0])
    rows.mean().backward()
    close(poisoned.grad, [[0.25, 0.25, 0.0], [0.0, 0.0, 0.0]])  # 1/2 tokens * 1/2 rows; row 1: nothing


def test_train_step_all_masked_row_contributes_zero():
    # Row 1 is fully padded: with masked_mean semantics it would be NaN and poison the whole loss.
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]], requires_grad=True)
    loss, meta = grpo_microbatch_train_step(lp, torch.tensor([[1, 1, 0], [0, 0, 0]]), 1, "reinforce_with_baseline",
                                            advantages=torch.tensor([2.0, 5.0]))
    # row 0: per-token [2, 4] -> 3; row 1: 0; batch mean 1.5
    close(loss, 1.5)
    close(meta["loss/policy"], 1.5)
    close(lp.grad, [[-0.5, -0.5, 0.0], [0.0, 0.0, 0.0]])  # -A / 2 tokens / 2 rows


def test_train_step_fully_masked_microbatch_gives_zero_loss_and_metrics():
    lp = torch.full((2, 3), -1.0, requires_grad=True)
    old = torch.zeros(2, 3)
    loss, meta = grpo_microbatch_train_step(lp, torch.zeros(2, 3), 1, "grpo_clip", advantages=torch.ones(2),
                                            old_log_probs=old, cliprange=0.2, ref_log_probs=old)
    close(loss, 0.0)
    for key in ("loss/clip_frac", "loss/ratio_mean", "kl/ref_k3"):
        close(meta[key], 0.0)
    close(lp.grad, torch.zeros(2, 3))


def test_masked_normalize_hand_values():
    close(masked_normalize(T6, M6, 2.0, dim=1), [1.5, 0.0])
    close(masked_normalize(T6, M6, 2.0), 1.5)
    close(masked_normalize(T6, M6), 3.0)
    with pytest.raises(ValueError, match="nonzero"):
        masked_normalize(T6, M6, 0.0)
    with pytest.raises(ValueError, match="not both"):
        masked_normalize(T6, M6, 2.0, constant_normalizer=3.0)
    with pytest.raises(ValueError, match="does not broadcast"):
        masked_mean(T6, torch.ones(4))


# --------------------------------------------------------------------------- KL estimators


def test_kl_estimators_hand_values():
    log_p, log_q = torch.tensor([[LN(0.5)]]), torch.tensor([[LN(0.25)]])
    close(grpo.KL_ESTIMATORS["log_ratio"](log_p, log_q), [[LN(2)]])  # log p - log q
    # k3 = q/p - log(q/p) - 1 = 0.5 + ln 2 - 1
    close(grpo.KL_ESTIMATORS["k3"](log_p, log_q), [[0.5 + LN(2) - 1]])
    close(0.5 + LN(2) - 1, 0.1931472, atol=1e-7)


def test_masked_kl_reductions_eq8():
    log_p = torch.tensor([[0.0, -1.0, 7.0], [-2.0, 0.0, 0.0]])
    log_q = torch.tensor([[-1.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # log-ratio per token: row 0 [1, 0], row 1 [-2]
    close(masked_kl(log_p, log_q, mask, "log_ratio", "sequence_sum"), (1 + 0 - 2) / 2)  # Eq. 8: (1/N) sum_i sum_t
    close(masked_kl(log_p, log_q, mask, "log_ratio", "token_mean"), (1 + 0 - 2) / 3)
    # k3 per token: log(q/p) = [-1, 0 | 2] -> e^-1 + 1 - 1, 0, e^2 - 2 - 1
    k3 = [math.exp(-1), 0.0, math.exp(2) - 3]
    close(masked_kl(log_p, log_q, mask, "k3", "sequence_sum"), (k3[0] + k3[1] + k3[2]) / 2)
    with pytest.raises(ValueError, match="'k9'"):
        masked_kl(log_p, log_q, mask, "k9")


def test_masked_kl_importance_weights():
    log_p = torch.tensor([[0.0, -1.0, 7.0], [-2.0, 0.0, 0.0]])
    log_q = torch.tensor([[-1.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    ones = torch.ones_like(log_p)
    close(masked_kl(log_p, log_q, mask, "k3", weights=ones), masked_kl(log_p, log_q, mask, "k3"))
    w = torch.tensor([[0.5, 3.0, float("nan")], [0.25, float("inf"), 1.0]])  # masked weights never count
    close(masked_kl(log_p, log_q, mask, "log_ratio", "sequence_sum", weights=w), (0.5 * 1 + 0 - 0.25 * 2) / 2)
    k3 = [math.exp(-1), 0.0, math.exp(2) - 3]
    close(masked_kl(log_p, log_q, mask, "k3", "token_mean", weights=w), (0.5 * k3[0] + 0.25 * k3[2]) / 3)
    # Truncated p/b: exp(0 - (-1)) = e, exp(-1 - 1) = e^-2, exp(5) capped at 10.
    log_b = torch.tensor([[-1.0, 1.0, 2.0]])
    close(grpo.kl_importance_weights(log_p[:1], log_b), [[math.e, math.exp(-2), 10.0]])


def test_importance_weighted_kl_recovers_on_policy_value():
    # Tokens drawn from b; the weighted estimate approaches the exact KL(p || q) that unweighted
    # k3 overshoots when p avoids tokens b still samples.
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.90, 0.09, 0.01])
    q = torch.tensor([0.40, 0.30, 0.30])
    b = torch.tensor([0.40, 0.30, 0.30])
    x = torch.multinomial(b, 200_000, replacement=True, generator=gen)[None, :]  # (1, N)
    log_p, log_q, log_b = p.log()[x], q.log()[x], b.log()[x]
    mask = torch.ones_like(log_p)
    exact = float((p * (p / q).log()).sum())
    w = grpo.kl_importance_weights(log_p, log_b)
    for est in ("log_ratio", "k3"):
        got = float(masked_kl(log_p, log_q, mask, est, "token_mean", weights=w))
        assert abs(got - exact) < 0.03 * exact, (est, got, exact)
    assert float(masked_kl(log_p, log_q, mask, "k3", "token_mean")) > 2 * exact


# --------------------------------------------------------------------------- microbatch train step


def test_train_step_masked_mean_hand_values():
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    loss, meta = grpo_microbatch_train_step(lp, torch.tensor([[1, 1, 0]]), 2, "reinforce_with_baseline",
                                            advantages=torch.tensor([[2.0]]))
    # per-token [2, 4, (6)] -> masked mean 3 -> / 2 accumulation steps
    close(loss, 1.5)
    close(meta["loss/policy"], 3.0)
    close(lp.grad, [[-0.5, -0.5, 0.0]])  # -A / 2 tokens / 2 steps


def test_train_step_masked_normalize_hand_values():
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    loss, _ = grpo_microbatch_train_step(lp, torch.tensor([[1, 1, 0]]), 2, "no_baseline",
                                         raw_rewards=torch.tensor([[2.0]]),
                                         length_normalization="masked_normalize", normalize_constant=4.0)
    close(loss, (2 + 4) / 4 / 2)
    close(lp.grad, [[-0.25, -0.25, 0.0]])  # -2 / 4 / 2


def test_train_step_grpo_clip_hand_values():
    lp = torch.log(torch.tensor([[1.5, 0.9, 1.0]])).requires_grad_(True)
    loss, meta = grpo_microbatch_train_step(lp, torch.tensor([[1, 1, 0]]), 1, "grpo_clip",
                                            advantages=torch.tensor([[1.0]]), old_log_probs=torch.zeros(1, 3),
                                            cliprange=0.2)
    close(loss, (-1.2 - 0.9) / 2)
    close(lp.grad, [[0.0, -0.9 / 2, 0.0]])  # clipped token: no gradient; d(-r)/dlp = -r
    close(meta["loss/clip_frac"], 0.5)  # over response tokens only
    close(meta["loss/ratio_mean"], 1.2)


def test_train_step_k3_penalty_hand_values():
    lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -2.0]])
    loss, meta = grpo_microbatch_train_step(lp, torch.ones(1, 2), 1, "reinforce_with_baseline",
                                            advantages=torch.zeros(1, 1), ref_log_probs=ref, kl_coef=0.5)
    # k3 with log(ref/p) = [0, -1]: [0, e^-1 + 1 - 1]
    close(meta["kl/ref_k3"], math.exp(-1) / 2)
    close(loss, 0.5 * math.exp(-1) / 2)
    # d k3 / d lp = 1 - exp(ref - lp)
    close(lp.grad, [[0.0, 0.5 * (1 - math.exp(-1)) / 2]])


def test_kl_coef_zero_leaves_loss_and_grad_unchanged():
    torch.manual_seed(0)
    base = torch.randn(3, 4)
    args = dict(advantages=torch.randn(3, 1), old_log_probs=base + 0.1 * torch.randn(3, 4), cliprange=0.2)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    a, b = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    loss_a, _ = grpo_microbatch_train_step(a, mask, 2, "grpo_clip", **args)
    ref = base - 1.0
    ref[1, 2] = base[1, 2] + 200.0  # exp(200) overflows: k3 is inf there, and 0 * inf would be NaN
    loss_b, meta_b = grpo_microbatch_train_step(b, mask, 2, "grpo_clip", **args, ref_log_probs=ref, kl_coef=0.0)
    assert torch.equal(loss_a, loss_b) and torch.equal(a.grad, b.grad)
    assert meta_b["kl/ref_k3"] == math.inf  # still reported


@pytest.mark.parametrize("kwargs, match", [
    (dict(kl_coef=0.1), "requires ref_log_probs"),
    (dict(kl_coef=-1.0, ref_log_probs=torch.zeros(1, 2)), "kl_coef must be >= 0"),
    (dict(length_normalization="masked_normalize"), "requires normalize_constant"),
    (dict(length_normalization="sum"), "unknown length_normalization 'sum'"),
])
def test_train_step_rejects_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        grpo_microbatch_train_step(torch.zeros(1, 2, requires_grad=True), torch.ones(1, 2), 1,
                                   "reinforce_with_baseline", advantages=torch.ones(1, 1), **kwargs)
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        grpo_microbatch_train_step(torch.zeros(1, 2, requires_grad=True), torch.ones(1, 2), 0,
                                   "reinforce_with_baseline", advantages=torch.ones(1, 1))


# --------------------------------------------------------------------------- entropy, log-probs


def test_compute_entropy_hand_values_and_stability():
    logits = torch.tensor([[0.0, 0.0, -math.inf], [0.0, LN(3), -math.inf]])
    # H(1/2, 1/2) = ln 2; H(1/4, 3/4) = 0.25 ln 4 + 0.75 ln(4/3) = 0.5623351
    close(compute_entropy(logits), [LN(2), 0.5623351])
    huge = compute_entropy(torch.tensor([[1e4, 0.0, -1e4], [3e38, 3e38, -3e38]]))
    close(huge, [0.0, LN(2)])
    assert compute_entropy(torch.zeros(2, 3, 4, dtype=torch.bfloat16)).dtype == torch.float32


def test_learner_entropy_reuses_log_softmax_and_equals_the_naive_formula():
    """Optimised (entropy from the log-probs get_response_log_probs already holds) vs naive
    (-sum p log p of a fresh softmax of the tempered logits), with banned (-inf) tokens."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 4  # (B, T, V)
    logits[..., 3] = -math.inf

    class Fixed(torch.nn.Module):
        def forward(self, ids):
            return logits

    ids = torch.zeros(3, 5, dtype=torch.long)
    out = get_response_log_probs(Fixed(), ids, ids, return_token_entropy=True, temperature=0.7)
    p = torch.softmax(logits / 0.7, dim=-1)  # (B, T, V)
    naive = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)  # (B, T)
    torch.testing.assert_close(out["token_entropy"], naive, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(entropy_from_log_probs(torch.log_softmax(logits, -1)), compute_entropy(logits))


class _TinyLM(nn.Module):
    def __init__(self, vocab: int = 11, dim: int = 8) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(vocab, dim), nn.Linear(dim, vocab)

    def forward(self, input_ids):
        return self.out(torch.tanh(self.emb(input_ids)))  # (B, T, V)


def _manual_log_probs(logits, labels, temperature):
    log_p = torch.log_softmax(logits / temperature, dim=-1)
    return log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_get_response_log_probs_plain_module(temperature):
    torch.manual_seed(0)
    model = _TinyLM()
    ids, labels = torch.randint(0, 11, (3, 5)), torch.randint(0, 11, (3, 5))
    out = get_response_log_probs(model, ids, labels, return_token_entropy=True, temperature=temperature)
    lp, ent = _manual_log_probs(model(ids), labels, temperature)
    close(out["log_probs"], lp)
    close(out["token_entropy"], ent)
    assert out["log_probs"].requires_grad and not out["token_entropy"].requires_grad
    assert "token_entropy" not in get_response_log_probs(model, ids, labels)


def test_get_response_log_probs_negative_labels_and_errors():
    model = _TinyLM()
    ids = torch.tensor([[1, 2, 3]])
    out = get_response_log_probs(model, ids, torch.tensor([[4, -100, 5]]))
    assert out["log_probs"][0, 1] == 0.0 and out["log_probs"][0, 0] < 0
    with pytest.raises(ValueError, match="temperature"):
        get_response_log_probs(model, ids, ids, temperature=0.0)
    with pytest.raises(TypeError, match="logits"):
        get_response_log_probs(lambda x: (x,), ids, ids)


def test_get_response_log_probs_hf_causal_lm():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=37, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    model = transformers.Qwen2ForCausalLM(config).eval()
    ids, labels = torch.randint(0, 37, (2, 6)), torch.randint(0, 37, (2, 6))
    out = get_response_log_probs(model, ids, labels, return_token_entropy=True, temperature=0.8)
    lp, ent = _manual_log_probs(model(ids).logits, labels, 0.8)
    close(out["log_probs"], lp)
    close(out["token_entropy"], ent)


# --------------------------------------------------------------------------- token layout


def test_pack_token_ids_seed_001_layout():
    out = pack_token_ids([[1, 2], [6]], [[3, 4, 5], [7]], pad_id=0)
    # full rows [1 2 3 4 5] and [6 7 0 0 0]
    assert out["input_ids"].tolist() == [[1, 2, 3, 4], [6, 7, 0, 0]]
    assert out["labels"].tolist() == [[2, 3, 4, 5], [7, 0, 0, 0]]
    assert out["response_mask"].tolist() == [[False, True, True, True], [True, False, False, False]]
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] is empty"):
        pack_token_ids([[1], []], [[2], [3]], 0)
    with pytest.raises(ValueError, match="len"):
        pack_token_ids([[1]], [[2], [3]], 0)


def test_pack_response_values_places_sampler_log_probs():
    mask = pack_token_ids([[1, 2], [6]], [[3, 4, 5], [7]], pad_id=0)["response_mask"]
    out = pack_response_values([torch.tensor([-0.1, -0.2, -0.3]), torch.tensor([-0.4])], mask)
    close(out, [[0.0, -0.1, -0.2, -0.3], [-0.4, 0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match=r"values\[1\] has 2 entries"):
        pack_response_values([torch.zeros(3), torch.zeros(2)], mask)


class _CharTokenizer:
    """The rlpipe.lm.tokenizer contract: encode(str) -> list[int], pad_token_id."""

    pad_token_id = 0
    eos_token_id = 27

    def encode(self, text: str) -> list[int]:
        return [ord(c) - 96 for c in text]  # a=1 ... z=26


def test_tokenize_prompt_and_output_hand_values():
    out = tokenize_prompt_and_output(["ab", "c"], ["cde", "d"], _CharTokenizer())
    # full rows [1 2 3 4 5] and [3 4 0 0 0]
    assert out["input_ids"].tolist() == [[1, 2, 3, 4], [3, 4, 0, 0]]
    assert out["labels"].tolist() == [[2, 3, 4, 5], [4, 0, 0, 0]]
    assert out["response_mask"].int().tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]


def test_tokenize_prompt_and_output_hf_tokenizer_adds_bos_to_prompt_only():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<pad>": 0, "<s>": 1, "hello": 2, "world": 3, "again": 4, "[UNK]": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>")
    out = tokenize_prompt_and_output(["hello", "hello world"], ["world again", "again"], hf)
    # prompt ids get BOS ([1 2], [1 2 3]); outputs do not ([3 4], [4])
    assert out["input_ids"].tolist() == [[1, 2, 3], [1, 2, 3]]
    assert out["labels"].tolist() == [[2, 3, 4], [2, 3, 4]]
    assert out["response_mask"].int().tolist() == [[0, 1, 1], [0, 0, 1]]
