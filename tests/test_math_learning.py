"""Learning test of the embedded arithmetic math task: GRPO through the Ray trainer changes the
parameters of a freshly pretrained TransformerLM and raises its validation answer reward.

What is tested. The whole math track on CPU, end to end: ``build_math_data`` -> ``train_bpe`` on the
corpus -> ``pretrain`` of ``math_pipeline(cfg)`` -> ``rlpipe.trainer.run.run`` (colocated_sync,
``task: math``, r1_zero prompt and grader). The assertions: the base model is learnable (its step-0
validation answer reward is strictly between 0 and 1, so GRPO groups have reward variance), the final
validation answer reward exceeds the initial one by ``MIN_GAIN``, and the final checkpoint's
parameters differ from the base's.

Why the settings are what they are (measured 2026-11 on a shared 2-core CPU). The task is made small
enough for a ~30 s pretraining (500 steps) to learn the r1_zero format and most of the arithmetic facts: one
operation per problem, operands 1..12, results 0..24, 95 % drills (5x more arithmetic per corpus
token than full prompts), and a 2-layer d_model-64 model. ``slip_rate`` 0.6 makes the operator
miscopy (see ``rlpipe.tasks.math.arithmetic``) the dominant error of the base model: one discrete
choice at one position, the same in every problem, which is what a few dozen GRPO steps can fix
(arithmetic facts themselves are not fixed in that budget: with 2-operation problems and slip 0.5,
30-40 GRPO steps at lr 1e-4..4e-4 left validation reward within sampling noise). Everything is
seeded (data seed 0, pretrain seed 0, run seed 0, validation sampling seed), so the numbers below
reproduce on the same machine and library versions.

Measured (three runs, identical numbers): validation answer reward 0.297 at step 0 and 0.375 after 40
steps (64 problems: 19 -> 24 right); train reward ~0.55 in the first steps, ~0.7 in the last. Wall
~70-77 s on 2 cores with load ~1.5 (pretraining ~32 s, Ray start + 40 GRPO steps + 2 validations
~35 s). A smaller budget did not show learning: 300 pretraining steps left the base model's
arithmetic too weak (val reward 0.05-0.27, GRPO gain <= 0 in 20-40 steps). Control: the same run at
learning_rate 1e-7 ends at 0.297 (gain 0), so the gain assertion fails when GRPO does not learn.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

pytestmark = pytest.mark.ray

ARITHMETIC = dict(num_train=128, num_val=64, min_ops=1, max_ops=1, max_operand=12, max_value=24,
                  corpus_documents=4000, drill_fraction=0.95, slip_rate=0.6, seed=0)
MODEL = {"preset": "cpu-tiny",
         "overrides": {"num_layers": 2, "d_model": 64, "num_heads": 2, "d_ff": 192, "context_length": 192}}
PRETRAIN = {"max_steps": 500, "batch_size": 16, "seq_len": 144, "threads": 2, "device": "cpu",
            "eval_every": 500, "warmup_steps": 20, "seed": 0}
STEPS = 40
TRAIN = {"n_grpo_steps": STEPS, "group_size": 8, "rollout_batch_size": 32, "train_batch_size": 32,
         "learning_rate": 3e-4, "sampling_temperature": 1.0, "sampling_max_tokens": 24, "sampling_min_tokens": 4,
         "val_every": STEPS, "val_size": 64, "checkpoint_every": STEPS, "log_rollouts_every": STEPS}
MIN_GAIN = 0.05  # measured gain 0.078 (0.297 -> 0.375), identical in three runs


def _config(seed: int):
    from rlpipe.config import parse_config

    return parse_config({
        "train": {"device": "cpu", "threads": 1, "ray_timeout_s": 300.0, "seed": seed, "val_seed": 1234 + seed},
        "math": {"arithmetic": ARITHMETIC, "tokenizer": {"vocab_size": 512}, "model": MODEL, "pretrain": PRETRAIN,
                 "train": TRAIN, "variants": {"onpolicy": {"mode": "colocated_sync"}}}})


@pytest.fixture(scope="module")
def math_base(tmp_path_factory, learning_seed):
    """(pipeline config path, base checkpoint, dataset dir): the arithmetic data, its BPE and a
    briefly pretrained math base model."""
    from rlpipe.config import ArithmeticConfig, math_pipeline, to_dict
    from rlpipe.lm.documents import read_documents
    from rlpipe.lm.pretrain import pretrain
    from rlpipe.lm.tokenizer import train_bpe
    from rlpipe.tasks.math.arithmetic import build_math_data

    tmp = tmp_path_factory.mktemp("math_learning")
    data = tmp / "data"
    build_math_data(ArithmeticConfig(**ARITHMETIC), data)
    train_bpe(read_documents(data / "corpus.txt"), 512, tmp / "tokenizer.json")
    cfg = math_pipeline(_config(learning_seed))
    threads = torch.get_num_threads()
    try:
        pretrain(cfg, data / "corpus.txt", tmp / "tokenizer.json", tmp / "base.pt", progress=False)
    finally:
        torch.set_num_threads(threads)  # pretrain sets the process-wide thread count
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    return path, tmp / "base.pt", data


@pytest.mark.learning
def test_grpo_changes_parameters_and_raises_val_answer_reward(math_base, ray_session, tmp_path, learning):
    from rlpipe.lm.checkpoint import load_checkpoint
    from rlpipe.trainer.run import run

    cfg, base, data = math_base
    out = tmp_path / "run"
    run(str(cfg), "onpolicy", str(out), str(base), str(data), threads=2)
    m = pd.read_parquet(out / "metrics.parquet").set_index("step")
    first, last = m.loc[0, "reward/val_answer_mean"], m.loc[STEPS, "reward/val_answer_mean"]
    assert m.loc[STEPS, "reward/val_mean"] == pytest.approx(last)  # math: val reward is the answer reward
    assert 0 < first < 1, first  # learnable: some but not all answers right
    learning.check("val answer reward, last - step 0", last - first, threshold=MIN_GAIN, noise=None)
    before = load_checkpoint(base).model.state_dict()
    after = load_checkpoint(Path(out) / "checkpoints" / "last.pt").model.state_dict()
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
