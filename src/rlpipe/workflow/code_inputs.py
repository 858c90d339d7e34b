"""A report's code as inputs of its rule, so that editing it reruns exactly the rules that run it and
nothing upstream (training lists no code: editing the trainer retrains nothing).

The lists are derived, never kept by hand: ``code_inputs(commands, "family-report")`` reads the entry
module of that ``rlpipe`` command (``rlpipe.cli.COMMANDS``) and follows its import statements,
transitively, through every rlpipe module it loads (with the package ``__init__`` files Python runs on
the way), without importing any of them (the plots would pull in matplotlib at parse time). It keeps
the modules of the entry's own package (``rlpipe.analysis`` for every report; the config and io layers
below reach a report through its params), and each data file beside them that a kept module names
(deliverables.py's seed_questions.yaml). ``tests/test_workflow_code_inputs.py`` holds every planned
job that runs a report against what importing its entry really loads.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from snakemake.exceptions import WorkflowError

#: the directory holding rlpipe/
RLPIPE_ROOT = Path(importlib.util.find_spec("rlpipe").origin).parent.parent


def module_source(name: str, root: Path = RLPIPE_ROOT) -> Path | None:
    """The file of a module or package under ``root``; None for a namespace package or a name that is no module."""
    p = root.joinpath(*name.split("."))
    return next((f for f in (p.with_suffix(".py"), p / "__init__.py") if f.is_file()), None)


def _absolute(node: ast.ImportFrom, package: str) -> str:
    base = node.module or ""
    if node.level:
        up = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
    return base


@cache
def module_imports(name: str, root: Path = RLPIPE_ROOT) -> tuple[frozenset, frozenset]:
    """(the rlpipe modules that loading ``name`` runs directly: its ancestor packages and what its import
    statements name, a submodule imported from a package included; the data files beside it that it
    names in a string)."""
    path = module_source(name, root)
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    parts = name.split(".")
    found = {".".join(parts[:i]) for i in range(1, len(parts))}
    data = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"[\w.-]+", node.value):
            beside = path.parent / node.value
            if beside.suffix != ".py" and beside.is_file():
                data.add(str(beside))
    rlpipe = frozenset(m for m in found if m.split(".")[0] == "rlpipe" and module_source(m, root))
    return rlpipe, frozenset(data)


def code_inputs(commands: Mapping[str, tuple], *names: str, root: Path = RLPIPE_ROOT) -> list[str]:
    """The source files (and the data files they name) of the entry modules of these ``rlpipe``
    commands (``commands``: name -> (entry module, ...), ``rlpipe.cli.COMMANDS``) and of every module
    of the entry's package that they load, as inputs: see the module docstring."""
    files = set()
    for command in names:
        if command not in commands:
            raise WorkflowError(f"code_inputs: no rlpipe command {command!r}")
        entry = commands[command][0]
        own = entry.rpartition(".")[0] + "."
        seen, todo = set(), [entry]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            modules, data = module_imports(m, root)
            todo += modules
            if m.startswith(own):
                files |= {str(module_source(m, root)), *data}
    return sorted(files)
