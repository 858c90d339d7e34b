"""Bring your own task: the generic text task, tasks by import path and by entry point, and the
check that runs before any work (a broken dataset, template or reward fails naming its file, line
or function)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rlpipe.config import ConfigError, TrainConfig
from rlpipe.tasks import TextTask, check_task, make_task, resolve_task
from rlpipe.tasks.base import DatasetError, Task
from rlpipe.tasks.registry import ENTRY_POINT_GROUP, TaskLoadError
from rlpipe.tasks.text.reward_ref import RewardLoadError, as_reward_dict, load_reward

REWARDS = '''
def contains_answer(response, ground_truth):
    return float(str(ground_truth) in response)

def as_dict(response, ground_truth):
    ok = str(ground_truth) in response
    return {"reward": float(ok), "format_reward": 1.0, "answer_reward": float(ok)}

def raises(response, ground_truth):
    raise KeyError("no such thing")

def returns_text(response, ground_truth):
    return "yes"

def hangs(response, ground_truth):
    import time
    time.sleep(30)
'''


@pytest.fixture
def text_data(tmp_path) -> Path:
    """A text dataset: capitals, one JSON object per line, plus a rewards file."""
    d = tmp_path / "capitals"
    d.mkdir()
    rows = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Peru", "Lima")]
    for split, part in (("train", rows), ("val", rows[:2])):
        (d / f"{split}.jsonl").write_text("".join(json.dumps({"country": c, "answer": a}) + "\n" for c, a in part))
    (tmp_path / "rewards.py").write_text(REWARDS)
    return d


def _train(tmp_path: Path, **text) -> TrainConfig:
    text = {"template": "The capital of {country} is", "reward": str(tmp_path / "rewards.py:contains_answer"),
            "stop": ["."], **text}
    return TrainConfig(task="text", text=text)


def test_text_task_builds_prompts_and_scores_with_the_users_reward(text_data, tmp_path):
    task = check_task(_train(tmp_path), text_data)
    assert isinstance(task, TextTask) and task.stop == (".",)
    assert [e.prompt for e in task.val_examples()] == ["The capital of France is", "The capital of Italy is"]
    assert task.train_examples()[2].ground_truth == "Madrid"
    assert task.reward(" Paris", "Paris") == {"reward": 1.0}  # a float is the reward; no made-up format score
    assert task.reward(" Lyon", "Paris") == {"reward": 0.0}
    dict_task = make_task("text", text_data, _train(tmp_path, reward=str(tmp_path / "rewards.py:as_dict")))
    assert dict_task.reward(" Rome", "Rome") == {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}


def test_template_file_and_whole_object_ground_truth(text_data, tmp_path):
    (tmp_path / "prompt.txt").write_text("Q: capital of {country}?\nA:")
    task = make_task("text", text_data, _train(tmp_path, template_file=str(tmp_path / "prompt.txt"), answer_field=None))
    assert task.train_examples()[0].prompt == "Q: capital of France?\nA:"
    assert task.train_examples()[0].ground_truth == {"country": "France", "answer": "Paris"}


def test_relative_reward_and_template_paths_become_absolute_when_parsed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Ray actors may run elsewhere: the parsed config holds absolute paths
    t = TrainConfig(task="text", text={"reward": "rewards.py:f", "template_file": "p.txt"})
    assert t.text.reward == f"{tmp_path}/rewards.py:f" and t.text.template_file == str(tmp_path / "p.txt")
    assert TrainConfig(task="text", text={"reward": "pkg.mod:f"}).text.reward == "pkg.mod:f"


@pytest.mark.parametrize("bad, match", [
    ({"task": "text"}, r"train.text.reward is required when train.task is 'text'"),
    ({"task": "not a task"}, r"train.task: String should match pattern"),
    ({"task": "text", "text": {"reward": "m:f", "stop": "."}}, r"train.text.stop"),
])
def test_config_refuses_a_bad_task_naming_the_key(bad, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**bad)


def _error(train: TrainConfig, data: Path) -> str:
    with pytest.raises((DatasetError, TaskLoadError, FileNotFoundError)) as e:
        check_task(train, data)
    return str(e.value)


def test_check_names_the_file_line_and_field(text_data, tmp_path):
    with open(text_data / "train.jsonl", "a") as f:
        f.write(json.dumps({"country": "Chile"}) + "\n")  # line 5: no answer
    msg = _error(_train(tmp_path), text_data)
    assert f"{text_data / 'train.jsonl'}:5: lacks field 'answer'" in msg
    (text_data / "train.jsonl").write_text('{"country": "Chile", "answer": "Santiago"}\n{not json\n')
    assert f"{text_data / 'train.jsonl'}:2: malformed JSON" in _error(_train(tmp_path), text_data)


def test_check_names_a_template_field_the_data_lacks(text_data, tmp_path):
    msg = _error(_train(tmp_path, template="Capital of {nation}:"), text_data)
    assert "train.jsonl:1: lacks field 'nation'" in msg
    assert "bad prompt template" in _error(_train(tmp_path, template="Capital of {country:"), text_data)


def test_check_calls_the_reward_and_names_it_when_it_raises_or_returns_junk(text_data, tmp_path):
    ref = str(tmp_path / "rewards.py:raises")
    msg = _error(_train(tmp_path, reward=ref), text_data)
    assert f"the reward {ref} raised KeyError" in msg and "training example 0" in msg and "'Paris'" in msg
    msg = _error(_train(tmp_path, reward=str(tmp_path / "rewards.py:returns_text")), text_data)
    assert "returns_text" in msg and "must return a float or a dict with 'reward', got str" in msg


def test_check_names_a_reward_that_runs_past_its_time_limit(text_data, tmp_path, monkeypatch):
    from rlpipe.rl import reward_guard

    monkeypatch.setattr(reward_guard, "REWARD_TIMEOUT_S", 0.5)
    ref = str(tmp_path / "rewards.py:hangs")
    msg = _error(_train(tmp_path, reward=ref), text_data)
    assert f"the reward {ref} gave no result within 0.5s (hung" in msg and "must return within 0.5s per sample" in msg


@pytest.mark.parametrize("ref, match", [
    ("{tmp}/missing.py:f", r"file .*missing.py does not exist"),
    ("{tmp}/rewards.py:nope", r"has no function 'nope'"),
    ("no_such_module_xyz:f", r"cannot import module 'no_such_module_xyz'.*PYTHONPATH"),
    ("justaname", r"expected 'package.module:function' or 'path/to/file.py:function'"),
])
def test_reward_reference_errors_name_what_is_missing(text_data, tmp_path, ref, match):
    with pytest.raises(RewardLoadError, match=match):
        load_reward(ref.format(tmp=tmp_path))


def test_reward_by_import_path_and_its_return_values(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_mod.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward("my_rewards_mod:contains_answer")("x Paris", "Paris") == 1.0
    assert as_reward_dict(1) == {"reward": 1.0}
    for bad in (True, "1", {"format_reward": 1.0}, {"reward": 1.0, "bonus": 2.0}, float("nan"), {"reward": "x"}):
        with pytest.raises(TypeError):
            as_reward_dict(bad)


PLUGIN = '''
from rlpipe.tasks.base import Example, Task

class EchoTask(Task):
    name = "echo"
    stop = ("\\n",)

    def __init__(self, dataset_dir, word="hello"):
        self.word = word

    def train_examples(self):
        return [Example(f"say {self.word}", self.word)]

    def val_examples(self):
        return self.train_examples()

    def reward(self, response, ground_truth):
        return {"reward": float(ground_truth in response)}

NOT_A_TASK = 3
'''


def test_a_task_class_by_import_path_gets_its_task_options(tmp_path, monkeypatch):
    (tmp_path / "echo_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    train = TrainConfig(task="echo_plugin:EchoTask", task_options={"word": "bonjour"})
    task = check_task(train, None)
    assert type(task).__name__ == "EchoTask" and task.train_examples()[0].prompt == "say bonjour"
    with pytest.raises(TaskLoadError, match="is not a subclass of rlpipe.tasks.Task"):
        resolve_task("echo_plugin:NOT_A_TASK")
    with pytest.raises(TaskLoadError, match="has no attribute 'Missing'"):
        resolve_task("echo_plugin:Missing")
    with pytest.raises(TaskLoadError, match=r"EchoTask\(dataset_dir, \*\*options\) failed.*colour"):
        check_task(TrainConfig(task="echo_plugin:EchoTask", task_options={"colour": "red"}), None)


def test_a_task_registered_by_an_installed_package_entry_point(tmp_path, monkeypatch):
    (tmp_path / "echo_plugin.py").write_text(PLUGIN)
    info = tmp_path / "echo_plugin-0.1.dist-info"  # what pip writes for [project.entry-points."rlpipe.tasks"]
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\necho = echo_plugin:EchoTask\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = resolve_task("echo")
    assert issubclass(cls, Task) and cls.__name__ == "EchoTask"
    with pytest.raises(TaskLoadError, match=r"unknown task 'chess'.*'echo'"):
        resolve_task("chess")  # the message lists what is registered


@pytest.mark.ray
def test_rlpipe_train_runs_a_text_task_and_refuses_a_broken_reward_before_ray(
        text_data, tmp_path, tiny_base, write_config, ray_session):
    from rlpipe.trainer import run as run_module

    text = {"template": "The capital of {country} is", "reward": str(tmp_path / "rewards.py:as_dict"),
            "stop": ["."]}
    train = {"task": "text", "text": text, "n_grpo_steps": 2, "group_size": 4, "rollout_batch_size": 8,
             "train_batch_size": 8, "val_every": 2, "val_size": 2, "sampling_max_tokens": 6}
    # disaggregated: the task is built in the generator actor and in the driver, from the config alone
    cfg = write_config(tmp_path / "text.yaml", train=train, variants={"disagg": {"mode": "disaggregated"}})
    for variant in ("disagg",):
        out = tmp_path / variant
        run_module.run(str(cfg), variant, str(out), tiny_base[0], str(text_data), threads=2)
        m = pd.read_parquet(out / "metrics.parquet")
        assert m["step"].max() == 2 and m.loc[m.step > 0, "reward/train_mean"].notna().all()
        assert m["reward/format_mean"].dropna().eq(1.0).all()  # the user's dict reward reached the metrics
    text["reward"] = str(tmp_path / "rewards.py:raises")
    bad = write_config(tmp_path / "bad.yaml", train=train, variants={"onpolicy": {}})
    with pytest.raises(run_module.InputError, match="the reward .*rewards.py:raises raised KeyError"):
        run_module.run(str(bad), "onpolicy", str(tmp_path / "bad"), tiny_base[0], str(text_data), threads=2)
    assert not (tmp_path / "bad" / "metrics.parquet").exists()


def test_a_reward_that_raises_is_the_last_line_of_the_job_log(text_data, tmp_path, tiny_base, write_config, capsys):
    """What `logs/train_variant/<v>.log` holds when a user's reward raises: `rlpipe train` stops before
    Ray starts, exit status 2, and its last line names the reward, the exception and the example."""
    from rlpipe.trainer import run as run_module

    text = {"template": "The capital of {country} is", "reward": str(tmp_path / "rewards.py:raises")}
    cfg = write_config(tmp_path / "bad.yaml", train={"task": "text", "text": text}, variants={"onpolicy": {}})
    argv = ["--config", str(cfg), "--variant", "onpolicy", "--base", tiny_base[0], "--dataset", str(text_data),
            "--out", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as e:
        run_module.main(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2
    assert "rewards.py:raises raised KeyError: 'no such thing' on training example 0" in last, last
    assert not (tmp_path / "run" / "metrics.parquet").exists()
