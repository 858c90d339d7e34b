"""Task plug-ins: deterministic prompt batches, dataset loading errors, rewards."""

import pytest

from rlpipe.tasks import TASKS, KeywordInclusionTask, SortingTask, make_task


def test_prompt_batches_are_deterministic_and_cover_each_epoch(tmp_path, make_dataset):
    task = KeywordInclusionTask(make_dataset(tmp_path / "d"))
    n_train = len(task.train_examples())  # 9
    a = [task.prompts_for_batch(b, 3, seed=7) for b in range(3)]
    b = [task.prompts_for_batch(b, 3, seed=7) for b in range(3)]
    assert a == b
    first_epoch = [e.prompt for batch in a for e in batch]
    assert sorted(first_epoch) == sorted(e.prompt for e in task.train_examples())  # each once per epoch
    assert [e.prompt for e in task.prompts_for_batch(0, 3, seed=8)] != first_epoch[:3] or n_train < 3


def test_keyword_task_reward_and_missing_dataset(tmp_path, make_dataset):
    task = make_task("keyword_inclusion", make_dataset(tmp_path / "d"))
    assert task.reward("The cats played.", ["cat"])["reward"] == 1.0
    assert task.reward("A dog.", ["cat"])["reward"] == 0.0
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        KeywordInclusionTask(tmp_path / "missing")
    with pytest.raises(ValueError, match="unknown task"):
        make_task("chess", None)


def test_sorting_task_rewards():
    task = SortingTask(n=4, seed=0)
    ex = task.train_examples()[0]
    assert task.reward(" ".join(map(str, sorted(ex.ground_truth))), ex.ground_truth)["reward"] == 1.0
    assert task.reward("", ex.ground_truth)["reward"] == 0.0


def test_registry_matches_the_config_choices():
    """Every built-in task name is a valid train.task and resolves to its class."""
    from rlpipe.config import TrainConfig
    from rlpipe.tasks import resolve_task

    assert set(TASKS) == {"keyword_inclusion", "sorting", "math", "text"}
    for name, cls in TASKS.items():
        extra = {"text": {"reward": "m:f"}} if name == "text" else {}
        assert TrainConfig(task=name, **extra).task == name and resolve_task(name) is cls
