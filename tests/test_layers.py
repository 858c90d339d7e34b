"""The package's layers and the direction of its imports (CONTRIBUTING's module map).

Every ``import`` statement in ``src/rlpipe`` is read with ``ast`` (lazy ones inside functions
too), so a violation fails here even if the offending code path never runs in a test:

- ``io`` and ``contract`` (the run-output names) <- ``config`` <- ``lm`` <- ``rl`` <- ``tasks`` <-
  ``trainer``; ``analysis`` sits beside them, imports only ``io``, ``contract`` and ``config``, and
  neither torch nor Ray (it must run where only pandas is installed); the trainer imports nothing of
  it.
- ``bench`` and ``cli`` sit on top; nothing imports them.
- rlpipe modules are imported at module level; function-level imports are kept for heavy or
  optional third-party packages only (ray in library code, matplotlib, transformers, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "rlpipe"

# layer -> rlpipe layers it may import (itself always allowed)
ALLOWED: dict[str, set[str]] = {
    "io": set(),
    "contract": set(),  # the run-output names: standard library only
    "config": {"io", "contract"},
    "lm": {"io", "contract", "config"},
    "rl": {"io", "contract", "config", "lm"},
    "tasks": {"io", "contract", "config", "lm", "rl"},
    "analysis": {"io", "contract", "config"},  # config: pydantic and yaml only (a family's metadata)
    "provenance": {"contract"},  # torch only inside provenance(): importing it stays light
    "trainer": {"io", "contract", "config", "lm", "rl", "tasks", "provenance"},
    "grpo": {"rl"},
    "bench": {"io", "contract", "config", "lm", "rl", "tasks", "trainer", "provenance"},
    "cli": {"config"},
    "watch": set(),  # python -m rlpipe.watch: the workflow's console heartbeat, standard library only
    "slurm": {"lm.model_config"},  # the workflow under SLURM: a model's size, without torch
    # the Snakemake workflow's logic, on top: task_checks (tasks, torch) is loaded only when a track needs it
    "workflow": {"io", "contract", "config", "tasks", "slurm"},
    "ray_slurm": set(),  # python -m rlpipe.ray_slurm: a job's Ray cluster across its nodes (ray inside its steps)
    "__init__": set(),
}
FORBIDDEN_THIRD_PARTY = {"analysis": {"torch", "ray"}, "config": {"torch", "ray"}, "io": {"ray"},
                         "contract": {"torch", "ray", "pandas", "numpy"}}


def layer_of(module: str) -> str:
    """``rlpipe.lm.model`` -> ``lm``; ``rlpipe.lm.model_config`` -> ``lm.model_config`` is
    matched by prefix in ``allowed``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] if len(parts) > 1 else parts
    return ".".join(parts)


def imports_of(source: str, module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import statement."""
    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    package = module if module.endswith("__init__") else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if base in ("rlpipe", "rlpipe.rl", "rlpipe.analysis") else base
                     for a in node.names]
            out += [(n, node.lineno, id(node) in top) for n in names]
    return out


def violations(source: str, module: str) -> list[str]:
    layer = layer_of(module)
    problems = []
    for name, line, top_level in imports_of(source, module):
        root = name.split(".")[0]
        if root == "rlpipe":
            target = ".".join(name.split(".")[1:3]) if name.count(".") >= 2 else layer_of(name)
            target_layer = layer_of(name)
            ok = target_layer == layer or any(target == a or target_layer == a or target.startswith(a + ".")
                                              for a in ALLOWED.get(layer, set()))
            if not ok:
                problems.append(f"{module}:{line}: layer '{layer}' imports {name}")
            if not top_level:
                problems.append(f"{module}:{line}: function-level import of {name} (import rlpipe modules at the top)")
        elif root in FORBIDDEN_THIRD_PARTY.get(layer, set()):
            problems.append(f"{module}:{line}: layer '{layer}' imports {root}")
    return problems


def package_modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_every_layer_imports_only_downwards():
    problems = [v for p in package_modules() for v in violations(p.read_text(), module_name(p))]
    assert not problems, "\n".join(problems)


def test_layers_are_folders():
    for layer in ("lm", "rl", "tasks", "trainer", "analysis", "bench"):
        assert (PKG / layer / "__init__.py").is_file() or (PKG / layer).is_dir(), layer
    assert (PKG / "grpo.py").is_file(), "rlpipe.grpo (the seed API) must stay importable under that name"


@pytest.mark.parametrize("module, source, expected", [
    ("rlpipe.lm.model", "from rlpipe.trainer.run import run\n", "layer 'lm' imports rlpipe.trainer.run"),
    ("rlpipe.lm.model", "import rlpipe.tasks.keyword.corpus\n", "layer 'lm' imports rlpipe.tasks"),
    ("rlpipe.analysis.plots", "import torch\n", "layer 'analysis' imports torch"),
    ("rlpipe.analysis.aggregate", "def f():\n    import ray\n", "layer 'analysis' imports ray"),
    ("rlpipe.analysis.plots", "from rlpipe.trainer import run_writer\n", "layer 'analysis' imports"),
    ("rlpipe.trainer.run", "from rlpipe.analysis.plots import main\n", "layer 'trainer' imports"),
    ("rlpipe.trainer.run", "from rlpipe.analysis import flat_reward\n", "layer 'trainer' imports"),
    ("rlpipe.trainer.run_writer", "from rlpipe.analysis.contract import PHASES\n", "layer 'trainer' imports"),
    ("rlpipe.contract", "from rlpipe.config import TrainConfig\n", "layer 'contract' imports"),
    ("rlpipe.rl.losses", "def f():\n    from rlpipe.lm.model import TransformerLM\n", "function-level import"),
])
def test_the_check_catches_violations(module, source, expected):
    assert any(expected in v for v in violations(source, module)), violations(source, module)


@pytest.mark.parametrize("module, source", [
    ("rlpipe.trainer.run", "from rlpipe.contract import PHASES\n"),
    ("rlpipe.analysis.plots", "from rlpipe import contract\n"),
    ("rlpipe.tasks.keyword.eval", "from rlpipe.lm.sampler import generate\n"),
    ("rlpipe.analysis.plots", "def f():\n    import matplotlib\n"),
    ("rlpipe.trainer.run", "def f():\n    import ray\n"),
])
def test_the_check_allows_downward_imports(module, source):
    assert violations(source, module) == []
