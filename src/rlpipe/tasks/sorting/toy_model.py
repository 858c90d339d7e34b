"""Seed 003's toy GRPO task: a non-autoregressive model that learns to sort n numbers.

The model embeds the prompt tokens, mixes them with one matrix per prompt position into a single
vector, decodes that into one vector per response position, and reads logits off the shared
embedding (seed 003 ``Model``). Each response position is sampled independently, so a response's
"log-prob" is a (G, R) table of per-position log-probs, exactly the (B, T) shape the GRPO losses take.

This is a learning test of the seed API (``rlpipe.grpo``): deltas come from ``compute_advantages``
and every update goes through ``grpo_microbatch_train_step``, the same code the LM trainer runs.

How it departs from seed 003, and why:

* ``torch.einsum`` instead of einops (no extra dependency).
* Parameters and samples come from a seeded ``torch.Generator``, not the global RNG, so a run is
  reproducible without touching global state.
* Seed 003's loss modes map to our loss types: ``naive`` -> ``reinforce_with_baseline`` (its
  "advantages" are the chosen deltas; ``no_baseline`` uses raw rewards whatever the delta mode),
  ``unclipped`` -> ``grpo_no_clip``, ``clipped`` -> ``grpo_clip``. Its ratio ``log_probs /
  old_log_probs`` is replaced by ``exp(log_probs - old_log_probs)``; its hard-coded clip epsilon
  0.01 becomes ``cliprange`` (default 0.2, the "typical" range its text gives).
* The k3 KL penalty is per token and averaged over positions like the policy loss (seed 003 sums
  over positions), so ``kl_coef`` here is seed 003's ``kl_penalty`` times the response length.
* The embedding is initialised N(0, 1/D) rather than nn.Embedding's N(0, 1). With N(0, 1) the
  initial logits have std ~ sqrt(3 * D) ~ 5.5, the policy starts nearly deterministic, most groups
  tie (zero advantage) and runs stall in worse local optima. Measured with seed 003's defaults
  (100 x 10 steps, lr 1e-3, seed 5), exact expected reward (max 5): N(0, 1) 2.27 -> 2.67..3.67,
  N(0, 1/D) 2.52 -> 4.11..4.33 over rewards/no_baseline, normalized and max deltas, and grpo_clip.
  ``embedding_init_std=1.0`` restores the seed's init.
* One record per epoch (rewards are fixed within an epoch) instead of one per inner step.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlpipe.rl.advantages import ADVANTAGE_MODES, AdvantageMode, compute_advantages
from rlpipe.rl.losses import LOSS_TYPES, RATIO_LOSS_TYPES, LossType
from rlpipe.rl.train_step import LengthNormalization, grpo_microbatch_train_step
from rlpipe.tasks.sorting.reward import sort_inclusion_ordering_reward

SortRewardFn = Callable[[list[int], list[int]], float]

SEED_PROMPTS: tuple[tuple[int, ...], ...] = ((1, 0, 2), (3, 2, 4), (1, 2, 3))  # seed 003 run_policy_gradient


class SortModel(nn.Module):
    """Seed 003 ``Model``: prompts (B, P) -> logits (B, R, V)."""

    def __init__(self, vocab_size: int, embedding_dim: int, prompt_length: int, response_length: int,
                 generator: torch.Generator | None = None, embedding_init_std: float | None = None) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.encode_weights = nn.Parameter(torch.empty(prompt_length, embedding_dim, embedding_dim))
        self.decode_weights = nn.Parameter(torch.empty(response_length, embedding_dim, embedding_dim))
        if embedding_init_std is None:  # see the module docstring: 1.0 starts almost deterministic
            embedding_init_std = 1.0 / math.sqrt(embedding_dim)
        with torch.no_grad():  # seed 003's init, drawn from `generator` for reproducibility
            self.embedding.weight.normal_(std=embedding_init_std, generator=generator)
            scale = 1.0 / math.sqrt(embedding_dim)
            self.encode_weights.normal_(generator=generator).mul_(scale)
            self.decode_weights.normal_(generator=generator).mul_(scale)

    def forward(self, prompts: Tensor) -> Tensor:
        emb = self.embedding(prompts)  # (B, P, D)
        encoded = torch.einsum("bpd,pde->be", emb, self.encode_weights)  # (B, D)
        decoded = torch.einsum("be,red->brd", encoded, self.decode_weights)  # (B, R, D)
        return torch.einsum("brd,vd->brv", decoded, self.embedding.weight)  # (B, R, V)


@torch.no_grad()
def generate_responses(prompts: Tensor, model: SortModel, num_responses: int,
                       generator: torch.Generator | None = None) -> Tensor:
    """Sample G responses per prompt, every position independently: (B, P) -> (B, G, R) int64."""
    logits = model(prompts)  # (B, R, V)
    batch, length, vocab = logits.shape
    probs = F.softmax(logits.reshape(batch * length, vocab), dim=-1)  # (B*R, V)
    flat = torch.multinomial(probs, num_responses, replacement=True, generator=generator)  # (B*R, G)
    return flat.reshape(batch, length, num_responses).transpose(1, 2).contiguous()  # (B, G, R)


def compute_log_probs(prompts: Tensor, responses: Tensor, model: SortModel) -> Tensor:
    """Per-position log-probs of ``responses`` (B, G, R) under ``model``: -> (B, G, R)."""
    log_p = F.log_softmax(model(prompts), dim=-1)  # (B, R, V)
    log_p = log_p.unsqueeze(1).expand(-1, responses.shape[1], -1, -1)  # (B, G, R, V), a view
    return log_p.gather(dim=-1, index=responses.unsqueeze(-1)).squeeze(-1)  # (B, G, R)


def compute_reward(prompts: Tensor, responses: Tensor, reward_fn: SortRewardFn) -> Tensor:
    """Score every response: prompts (B, P), responses (B, G, R) -> rewards (B, G) float32."""
    prompt_lists, response_lists = prompts.tolist(), responses.tolist()
    pairs = zip(prompt_lists, response_lists, strict=True)
    return torch.tensor([[float(reward_fn(p, r)) for r in rs] for p, rs in pairs], dtype=torch.float32)


def default_reward_fn() -> SortRewardFn:
    """Seed 003's default, ``sort_inclusion_ordering_reward``."""

    return sort_inclusion_ordering_reward


@dataclass(frozen=True)
class SortTrainConfig:
    """Seed 003 ``run_policy_gradient`` arguments (its defaults, except ``cliprange``)."""

    prompts: tuple[tuple[int, ...], ...] = SEED_PROMPTS
    embedding_dim: int = 10
    embedding_init_std: float | None = None  # None: 1/sqrt(embedding_dim); seed 003 used 1.0
    num_epochs: int = 100
    num_steps_per_epoch: int = 10
    num_responses: int = 10
    advantage_mode: AdvantageMode = "rewards"
    loss_type: LossType = "reinforce_with_baseline"
    cliprange: float = 0.2
    advantage_eps: float = 1e-5
    kl_coef: float = 0.0
    ref_period: int = 10
    learning_rate: float = 1e-3
    length_normalization: LengthNormalization = "masked_mean"
    seed: int = 5
    reward_fn: SortRewardFn | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        lengths = {len(p) for p in self.prompts}
        if not self.prompts or len(lengths) != 1 or 0 in lengths:
            raise ValueError(f"prompts must be non-empty and all the same length, got {self.prompts}")
        if any(not isinstance(t, int) or t < 0 for p in self.prompts for t in p):
            raise ValueError(f"prompts must hold non-negative ints, got {self.prompts}")
        if self.advantage_mode not in ADVANTAGE_MODES:
            raise ValueError(f"unknown advantage_mode {self.advantage_mode!r}; valid: {list(ADVANTAGE_MODES)}")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; valid: {list(LOSS_TYPES)}")
        for key in ("embedding_dim", "num_epochs", "num_steps_per_epoch", "num_responses", "ref_period"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")


@dataclass(frozen=True)
class SortEpochRecord:
    epoch: int
    mean_reward: float  # of the responses sampled at the start of the epoch
    loss: float  # mean over the epoch's inner steps
    clip_frac: float | None  # grpo_clip only
    kl_ref: float | None  # k3 token mean against the reference, when kl_coef > 0


@dataclass
class SortTrainResult:
    model: SortModel
    records: list[SortEpochRecord]

    @property
    def mean_rewards(self) -> list[float]:
        return [r.mean_reward for r in self.records]


@dataclass
class _Rollout:
    responses: Tensor  # (B, G, R)
    rewards: Tensor  # (B*G, 1)
    advantages: Tensor  # (B*G, 1)
    old_log_probs: Tensor | None  # (B*G, R)
    ref_log_probs: Tensor | None  # (B*G, R)


def _rollout(cfg: SortTrainConfig, prompts: Tensor, model: SortModel, ref_model: SortModel | None,
             reward_fn: SortRewardFn, gen: torch.Generator) -> _Rollout:
    """Outer-loop work (seed 003 §4.1): sample, score, deltas, cached pi_old / pi_ref log-probs."""
    responses = generate_responses(prompts, model, cfg.num_responses, gen)  # (B, G, R)
    rewards = compute_reward(prompts, responses, reward_fn).reshape(-1)  # (B*G,)
    advantages = compute_advantages(rewards, cfg.num_responses, cfg.advantage_mode, cfg.advantage_eps)
    flat = (-1, responses.shape[-1])
    with torch.no_grad():
        old = (compute_log_probs(prompts, responses, model).reshape(flat)
               if cfg.loss_type in RATIO_LOSS_TYPES else None)
        ref = compute_log_probs(prompts, responses, ref_model).reshape(flat) if ref_model is not None else None
    return _Rollout(responses, rewards.unsqueeze(-1), advantages.unsqueeze(-1), old, ref)


def build_model(cfg: SortTrainConfig) -> SortModel:
    """The model ``train_sorting`` starts from: vocab = max prompt token + 1, R = P (seed 003)."""
    length = len(cfg.prompts[0])
    vocab = max(max(p) for p in cfg.prompts) + 1
    return SortModel(vocab, cfg.embedding_dim, length, length, generator=torch.Generator().manual_seed(cfg.seed),
                     embedding_init_std=cfg.embedding_init_std)


def train_sorting(cfg: SortTrainConfig = SortTrainConfig()) -> SortTrainResult:
    """Seed 003 ``run_policy_gradient``: outer loop samples, inner loop takes optimizer steps."""
    reward_fn = cfg.reward_fn or default_reward_fn()
    gen = torch.Generator().manual_seed(cfg.seed + 1)  # sampling stream, separate from the init's
    prompts = torch.tensor(cfg.prompts, dtype=torch.long)  # (B, P)
    length = prompts.shape[1]
    model = build_model(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
    ref_model: SortModel | None = None
    records = []
    for epoch in range(cfg.num_epochs):
        if cfg.kl_coef > 0 and epoch % cfg.ref_period == 0:
            ref_model = copy.deepcopy(model).requires_grad_(False)
        ro = _rollout(cfg, prompts, model, ref_model, reward_fn, gen)
        mask = torch.ones(ro.responses.shape[0] * ro.responses.shape[1], length, dtype=torch.bool)  # (B*G, R)
        losses, clip_fracs, kls = [], [], []
        for _ in range(cfg.num_steps_per_epoch):
            log_probs = compute_log_probs(prompts, ro.responses, model).reshape(mask.shape)  # (B*G, R)
            optimizer.zero_grad(set_to_none=True)
            loss, meta = grpo_microbatch_train_step(
                log_probs, mask, 1, cfg.loss_type, raw_rewards=ro.rewards, advantages=ro.advantages,
                old_log_probs=ro.old_log_probs, cliprange=cfg.cliprange,
                length_normalization=cfg.length_normalization, normalize_constant=float(length),
                ref_log_probs=ro.ref_log_probs, kl_coef=cfg.kl_coef)
            optimizer.step()
            losses.append(loss.item())
            if "loss/clip_frac" in meta:
                clip_fracs.append(float(meta["loss/clip_frac"]))
            if "kl/ref_k3" in meta:
                kls.append(float(meta["kl/ref_k3"]))
        records.append(SortEpochRecord(
            epoch=epoch, mean_reward=ro.rewards.mean().item(), loss=sum(losses) / len(losses),
            clip_frac=sum(clip_fracs) / len(clip_fracs) if clip_fracs else None,
            kl_ref=sum(kls) / len(kls) if kls else None))
    return SortTrainResult(model=model, records=records)


def expected_reward(model: SortModel, prompts: Sequence[Sequence[int]], reward_fn: SortRewardFn) -> float:
    """Exact mean over prompts of E[reward] under the model, enumerating all V**R responses
    (positions are independent, so a response's probability is the product of its positions')."""
    prompt_t = torch.tensor(prompts, dtype=torch.long)  # (B, P)
    vocab = model.embedding.num_embeddings
    length = model.decode_weights.shape[0]
    if vocab ** length > 100_000:
        raise ValueError(f"{vocab}**{length} responses are too many to enumerate")
    grid = torch.cartesian_prod(*[torch.arange(vocab)] * length).reshape(-1, length)  # (N, R)
    responses = grid.unsqueeze(0).expand(prompt_t.shape[0], -1, -1)  # (B, N, R)
    with torch.no_grad():
        probs = compute_log_probs(prompt_t, responses, model).sum(dim=-1).exp()  # (B, N)
    rewards = compute_reward(prompt_t, responses, reward_fn)  # (B, N)
    return (probs * rewards).sum(dim=-1).mean().item()

