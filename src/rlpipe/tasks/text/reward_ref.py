"""Load a reward function named by reference: ``package.module:function`` or ``path/to/file.py:function``.

Neither seed has this: the seeds' rewards are functions of the package. It is what TRL's
``reward_funcs``, verl's ``custom_reward_function.path`` / ``.name`` and OpenRLHF's remote reward
give their users, and it lets a user's reward run in every Ray actor without editing rlpipe: the
reference is a string in the config, resolved in each process that scores.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlpipe.tasks.reward_dict import REWARD_KEYS


class RewardLoadError(ValueError):
    """A reward reference cannot be loaded; the message names the reference, file or function."""


def _load_file_module(path: Path, ref: str):
    if not path.is_file():
        raise RewardLoadError(f"reward {ref!r}: file {path} does not exist")
    # a module name per file path: two reward files with the same name never shadow each other
    name = "rlpipe_user_reward_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RewardLoadError(f"reward {ref!r}: {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise RewardLoadError(f"reward {ref!r}: importing {path} raised {type(e).__name__}: {e}") from None
    sys.modules[name] = module
    return module


def load_reward(ref: str) -> Callable[..., Any]:
    """The function ``ref`` names. Raises ``RewardLoadError`` naming what is missing."""
    target, sep, fn_name = ref.rpartition(":")
    if not sep or not target or not fn_name.isidentifier():
        raise RewardLoadError(f"reward {ref!r}: expected 'package.module:function' or 'path/to/file.py:function'")
    if target.endswith(".py") or "/" in target:
        module = _load_file_module(Path(target), ref)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:
            raise RewardLoadError(f"reward {ref!r}: cannot import module {target!r} "
                                  f"({type(e).__name__}: {e}); is it installed or on PYTHONPATH?") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise RewardLoadError(f"reward {ref!r}: {target} has no function {fn_name!r}")
    if not callable(fn):
        raise RewardLoadError(f"reward {ref!r}: {target}.{fn_name} is a {type(fn).__name__}, not a function")
    return fn


def as_reward_dict(value: Any) -> dict[str, float]:
    """A user reward's return value as the reward dict: a number is the ``reward`` (``format_reward``
    and ``answer_reward`` are left out, so their columns stay empty rather than made up); a dict must
    hold a finite ``reward`` and may hold the other two keys. Raises ``TypeError`` otherwise (the
    trainer's guard scores that sample 0 and counts it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        raise TypeError(f"a reward must return a float or a dict with 'reward', got {type(value).__name__}")
    out = {"reward": value} if not isinstance(value, dict) else dict(value)
    unknown = set(out) - set(REWARD_KEYS)
    if "reward" not in out or unknown:
        raise TypeError(f"a reward dict needs 'reward' and may hold {list(REWARD_KEYS)}; got keys {sorted(out)}")
    try:
        out = {k: float(v) for k, v in out.items()}
    except (TypeError, ValueError):
        raise TypeError(f"a reward dict's values must be numbers, got {value!r}") from None
    if not all(math.isfinite(v) for v in out.values()):
        raise TypeError(f"a reward must be finite, got {value!r}")
    return out
