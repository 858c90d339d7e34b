"""Old log-probs (seed 001 Problem 13): the on-policy importance ratio is 1.

For our TransformerLM and a tiny HF Qwen2, on fp32 CPU, a freshly sampled and scored rollout batch
gives exp(new - old) = 1 (max over response tokens within 1e-4) when the learner scores it with the
generator's weights, whether ``old`` is the learner's recomputed log-probs
(``Learner.recompute_old_logprobs``) or the sampler's behaviour log-probs. A perturbed learner
shows that the check can fail. No Ray: the roles are used directly.
"""

from __future__ import annotations

import pytest
import torch

from rlpipe.config import TrainConfig
from rlpipe.rl.records import RolloutBatch
from rlpipe.rl.scoring import score_batch
from rlpipe.tasks import make_task
from rlpipe.trainer.actors.generator import Generator
from rlpipe.trainer.actors.learner import SAMPLER_GAP_METRIC, Learner, build_train_tensors, response_log_probs

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOL = 1e-4


def _cfg(task: str, recompute: bool) -> TrainConfig:
    return TrainConfig(task=task, device="cpu", rollout_batch_size=8, group_size=4, train_batch_size=8,
                       gradient_accumulation_steps=2, sampling_max_tokens=16, sampling_temperature=0.9,
                       recompute_old_log_probs=recompute, kl_monitor=False)


@pytest.fixture(scope="module", params=["rlpipe", "hf", "gpt2", "gpt_neox"])
def backend(request, tiny_base, tiny_qwen, random_hf, math_fixture):
    """(base, task name, dataset dir) of our TransformerLM (keyword task), the tiny Qwen2 (math), or a
    random GPT-2 / GPT-NeoX (math): the sampler and the learner must agree on any causal LM."""
    if request.param == "rlpipe":
        return tiny_base[0], "keyword_inclusion", tiny_base[1]
    if request.param == "hf":
        return str(tiny_qwen), "math", str(math_fixture)
    return str(random_hf(request.param)), "math", str(math_fixture)


def _rollout(base: str, task_name: str, data: str, recompute: bool) -> tuple[Learner, RolloutBatch]:
    cfg = _cfg(task_name, recompute)
    task = make_task(task_name, data, cfg)
    gen = Generator(base, cfg, stop=task.stop, include_stop=task.include_stop_str_in_output)
    learner = Learner(base, cfg)
    batch = score_batch(gen.generate(task.prompts_for_batch(0, 2, cfg.seed), 1), task, cfg)
    if recompute:
        batch = learner.recompute_old_logprobs(batch, 1)
    return learner, batch


@torch.no_grad()
def _ratio_error(learner: Learner, batch: RolloutBatch) -> float:
    """max |exp(new - old) - 1| over response tokens, new = the learner's forward."""
    t = build_train_tensors(batch, learner.pad_id)
    new = response_log_probs(learner.model, t, learner.cfg)["log_probs"]  # (B, T)
    ratio = torch.exp(new - t.old_log_probs)[t.response_mask]  # (N,)
    assert ratio.numel() == batch.response_tokens() > 0
    return float((ratio - 1).abs().max())


@pytest.mark.parametrize("recompute", [True, False], ids=["recomputed", "behaviour"])
def test_on_policy_ratio_is_one(backend, recompute):
    learner, batch = _rollout(*backend, recompute)
    assert (batch.old_logprobs is not None) == recompute
    assert _ratio_error(learner, batch) < TOL
    if recompute:  # the recomputed values are exactly the learner's, and close to the sampler's
        t = build_train_tensors(batch, learner.pad_id)
        assert not torch.equal(t.old_log_probs, t.behaviour_log_probs) or batch.reward_metrics[SAMPLER_GAP_METRIC] == 0
        assert 0 <= batch.reward_metrics[SAMPLER_GAP_METRIC] < TOL


@pytest.mark.parametrize("recompute", [True, False], ids=["recomputed", "behaviour"])
def test_perturbed_learner_breaks_the_ratio(backend, recompute):
    """The check can fail: weights that differ from the sampler's give ratios far from 1."""
    learner, batch = _rollout(*backend, recompute)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert _ratio_error(learner, batch) > 1e-2


def test_recomputed_old_logprobs_survive_group_selection_and_concat(tiny_base):
    learner, batch = _rollout(tiny_base[0], "keyword_inclusion", tiny_base[1], True)
    with torch.no_grad():  # make recomputed and behaviour values distinguishable
        batch.old_logprobs = [lp - 1.0 for lp in batch.old_logprobs]
    joined = RolloutBatch.concat([batch.select_groups([1]), batch.select_groups([0])])
    assert [lp.tolist() for lp in joined.old_logprobs] == [lp.tolist() for lp in batch.old_logprobs[4:] +
                                                            batch.old_logprobs[:4]]
    t = build_train_tensors(joined, learner.pad_id)
    assert torch.allclose(t.old_log_probs[t.response_mask], t.behaviour_log_probs[t.response_mask] - 1.0, atol=TOL)
    plain = batch.select_groups([0])
    plain.old_logprobs = None
    with pytest.raises(ValueError, match="recomputed old_logprobs"):
        RolloutBatch.concat([plain, batch.select_groups([1])])


def test_train_step_on_recomputed_batch_reports_the_gap(tiny_base):
    learner, batch = _rollout(tiny_base[0], "keyword_inclusion", tiny_base[1], True)
    res = learner.train_step(batch, None, 1)
    assert res.version == 1 and "kl/ref_k3" not in res.metrics  # no reference: no kl/ref_* metrics
    assert torch.isfinite(torch.tensor(res.metrics["loss/policy"]))
    events = learner.prof.drain()
    assert {"old_logprobs", "update"} <= {e.phase for e in events}


def test_kl_monitor_every_measures_only_the_due_steps(tiny_base):
    """train.kl_monitor_every: the KLs (and the reference forward) run on step 1, every N-th step
    and the last one; with a KL penalty on every step, since the loss reads the reference."""
    from rlpipe.trainer.actors.reference import ReferenceModel
    from rlpipe.trainer.actors.workers import _update

    cfg = _cfg("keyword_inclusion", False).model_copy(update={"kl_monitor": True, "kl_monitor_every": 3,
                                                               "n_grpo_steps": 7})
    task = make_task("keyword_inclusion", tiny_base[1], cfg)
    gen, learner = Generator(tiny_base[0], cfg, stop=task.stop), Learner(tiny_base[0], cfg)
    ref = ReferenceModel(tiny_base[0], cfg)
    batch = score_batch(gen.generate(task.prompts_for_batch(0, 2, cfg.seed), 1), task, cfg)
    measured = [s for s in range(1, 8) if "kl/ref_k3" in _update(learner, ref, batch, s).metrics]
    assert measured == [1, 3, 6, 7]
    ref_calls = [e.step for e in ref.prof.drain() if e.phase == "ref_logprobs"]
    assert ref_calls == [1, 3, 6, 7]  # the reference forward is skipped between them
    learner.cfg = cfg.model_copy(update={"kl_coef": 0.1})
    assert all(learner.kl_due(s) for s in range(1, 8))
