"""Which class a config's ``train.task`` names, its options, and the check before any work.

``train.task`` is one of:
- a built-in name (``BUILTIN``: keyword_inclusion, sorting, math, text);
- an import path ``package.module:TaskClass`` to a ``rlpipe.tasks.base.Task`` subclass;
- a name an installed package registers under the ``rlpipe.tasks`` entry-point group
  (``[project.entry-points."rlpipe.tasks"] mytask = "mypkg.task:MyTask"`` in its pyproject.toml).

A plug-in class is built as ``TaskClass(dataset_dir, **train.task_options)``; the built-in math
and text tasks take their options from ``train.math`` and ``train.text``. ``check_task`` runs in
``rlpipe train`` and ``rlpipe eval`` before Ray starts: it loads the class, reads the dataset,
imports the reward and calls it on the first examples, so a broken task fails in seconds with a
message naming the file, line or function, not inside an actor minutes later.
"""

from __future__ import annotations

import importlib
import math
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from rlpipe.config import TrainConfig, to_dict
from rlpipe.rl import reward_guard
from rlpipe.tasks.base import DatasetError, Task
from rlpipe.tasks.keyword.task import KeywordInclusionTask
from rlpipe.tasks.math.task import MathTask
from rlpipe.tasks.sorting.task import SortingTask
from rlpipe.tasks.text.task import TextTask

ENTRY_POINT_GROUP = "rlpipe.tasks"
BUILTIN: dict[str, type[Task]] = {cls.name: cls for cls in (KeywordInclusionTask, SortingTask, MathTask, TextTask)}
CHECK_EXAMPLES = 3  # examples the reward is called on before any work
#: Built-in tasks whose reward is rlpipe's own (tested in the package); the text task and plug-ins
#: run a user's reward, which ``check_task`` calls on the first examples.
SELF_CONTAINED = (KeywordInclusionTask, SortingTask, MathTask)
SAMPLE_RESPONSE = "a sample response"


class TaskLoadError(ValueError):
    """``train.task`` cannot be loaded or fails its check; the message says what was expected."""


def _import_class(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise TaskLoadError(f"train.task {spec!r}: cannot import module {module_name!r} ({type(e).__name__}: {e}); "
                            "is it installed or on PYTHONPATH?") from None
    if not hasattr(module, attr):
        raise TaskLoadError(f"train.task {spec!r}: module {module_name} has no attribute {attr!r}")
    return getattr(module, attr)


def _entry_point(name: str) -> Any:
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        registered = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        raise TaskLoadError(f"unknown task {name!r} (train.task): not a built-in task {sorted(BUILTIN)} "
                            f"nor a name registered under the {ENTRY_POINT_GROUP!r} entry points {registered}; "
                            "for a class in your own code write 'package.module:ClassName'")
    try:
        return found[0].load()
    except Exception as e:
        raise TaskLoadError(f"train.task {name!r}: its entry point {found[0].value!r} failed to load "
                            f"({type(e).__name__}: {e})") from None


def resolve_task(spec: str) -> type[Task]:
    """The ``Task`` subclass ``spec`` names (see the module docstring)."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    cls = _import_class(spec) if ":" in spec else _entry_point(spec)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TaskLoadError(f"train.task {spec!r}: {cls!r} is not a subclass of rlpipe.tasks.Task "
                            "(see the Task protocol in the API reference)")
    return cls


def task_options(cls: type[Task], train: TrainConfig | None) -> dict[str, Any]:
    """Constructor keyword arguments of task class ``cls`` from a run's train config (none without one)."""
    if train is None or cls in (KeywordInclusionTask, SortingTask):
        return {}
    if cls is MathTask:
        return to_dict(train.math)
    if cls is TextTask:
        return to_dict(train.text)
    return dict(train.task_options)


def make_task(name: str, dataset_dir: str | Path | None, train: TrainConfig | None = None) -> Task:
    """Task ``name`` on ``dataset_dir``, with its options from ``train`` (see ``task_options``)."""
    cls = resolve_task(name)
    try:
        return cls(dataset_dir, **task_options(cls, train))
    except TypeError as e:
        raise TaskLoadError(f"train.task {name!r}: {cls.__name__}(dataset_dir, **options) failed: {e}") from None


def _check_reward(task: Task, spec: str) -> None:
    """The reward, called on the first training examples under the trainer's guard (its time limit)."""
    examples = task.train_examples()[:CHECK_EXAMPLES]
    if not examples:
        raise TaskLoadError(f"train.task {spec!r}: the dataset has no training examples")
    name = getattr(task, "reward_ref", f"{type(task).__name__}.reward")
    for i, ex in enumerate(examples):
        if not isinstance(ex.prompt, str) or not ex.prompt:
            raise TaskLoadError(f"train.task {spec!r}: training example {i} has no prompt text: {ex.prompt!r}")
        out, error = reward_guard.call_with_deadline(task.reward, (SAMPLE_RESPONSE, ex.ground_truth))
        where = (f"on training example {i} (response {SAMPLE_RESPONSE!r}, ground truth "
                 f"{str(ex.ground_truth)[:80]!r})")
        if error is not None:
            error = error if error.startswith("raised") else f"gave {error}"
            raise TaskLoadError(f"train.task {spec!r}: the reward {name} {error} {where}; a reward must return "
                                f"within {reward_guard.REWARD_TIMEOUT_S:g}s per sample and not raise") from None
        try:
            ok = isinstance(out, dict) and math.isfinite(float(out["reward"]))
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise TaskLoadError(f"train.task {spec!r}: the reward {name} returned {str(out)[:80]!r} {where}; "
                                "expected a dict with a finite 'reward'")


def check_task(train: TrainConfig, dataset_dir: str | Path | None) -> Task | None:
    """Read the task's dataset and, for a user's reward (the text task's, a plug-in's), build the
    task and call the reward on the first examples. Returns the task when it was built (None for the
    package's own tasks, whose rewards are tested: reading their data is the check). Every failure is
    a ``TaskLoadError``, ``DatasetError`` or ``FileNotFoundError`` naming the file, line or function."""
    cls = resolve_task(train.task)
    cls.check_dataset(dataset_dir, task_options(cls, train))
    if cls in SELF_CONTAINED:
        return None
    try:
        task = make_task(train.task, dataset_dir, train)
    except (DatasetError, FileNotFoundError, TaskLoadError):
        raise
    except ValueError as e:  # a reward reference or option the task refuses
        raise TaskLoadError(f"train.task {train.task!r}: {e}") from None
    _check_reward(task, train.task)
    return task
