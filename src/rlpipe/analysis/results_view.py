"""A finished run's ``results/`` directory, read back for the written answers (``rlpipe.analysis.answers``).

``ResultsView.load(results)`` reads what the stages left, each part optional (a run of one track
has only some of them):

- ``summary/discussion.json``: the main discussion's sections by id (``rlpipe.analysis.report_text``);
- ``summary/runs.parquet``: the systems comparison's table (one row per variant);
- ``families/<family>/report/family.json``: each family's numbers (``rlpipe.analysis.families``);
- ``math/eval/<model>/``: the MATH track's evaluations (``contract.EVAL_FILES``);
- ``math/report/math.json``: the MATH track's learning numbers (``rlpipe.analysis.math_report``);
- ``math/runs/*/config.yaml`` and ``math/base/model.log.json``: what data and model the MATH track
  used, so the answers name the task and model truthfully;
- ``toy_sort/table.csv``: seed 003's grid (``rlpipe.analysis.toy_sort``);
- ``runs/*/config.yaml``: the replay run's ``train.replay`` settings (its aging and sampling).

A file that exists but cannot be parsed raises ``ValueError`` naming it. Not in the seeds: they
have one writeup per student; ours is assembled from the stages' outputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from rlpipe import contract


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is unreadable: {e}") from None


@dataclass
class Eval:
    """One ``rlpipe eval`` output: its summary.json and examples.parquet (empty frame if absent)."""

    summary: dict
    examples: pd.DataFrame


@dataclass
class ResultsView:
    root: Path
    sections: dict[str, dict] = field(default_factory=dict)
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    families: dict[str, dict] = field(default_factory=dict)
    evals: dict[str, Eval] = field(default_factory=dict)
    math: dict = field(default_factory=dict)
    math_config: dict = field(default_factory=dict)
    math_model: dict = field(default_factory=dict)
    toy_sort: pd.DataFrame = field(default_factory=pd.DataFrame)
    replay: dict = field(default_factory=dict)  # the replay run's train.replay settings, with its variant

    @classmethod
    def load(cls, results: str | Path) -> ResultsView:
        root = Path(results)
        view = cls(root)
        summary = root / "summary"
        disc = summary / contract.SUMMARY_FILES["discussion_json"]
        if disc.is_file():
            view.sections = {s["id"]: s for s in _json(disc).get("sections", [])}
        if (summary / contract.SUMMARY_FILES["runs"]).is_file():
            view.runs = pd.read_parquet(summary / contract.SUMMARY_FILES["runs"])
        name = contract.FAMILY_REPORT_FILES["numbers"]
        for path in sorted((root / "families").glob(f"*/{contract.FAMILY_REPORT_DIR}/{name}")):
            view.families[path.parent.parent.name] = _json(path)
        for path in sorted((root / "math" / "eval").glob(f"*/{contract.EVAL_FILES['summary']}")):
            examples = path.parent / contract.EVAL_FILES["examples"]
            view.evals[path.parent.name] = Eval(
                _json(path), pd.read_parquet(examples) if examples.is_file() else pd.DataFrame())
        math_json = root / "math" / "report" / contract.MATH_REPORT_FILES["math_json"]
        view.math = _json(math_json) if math_json.is_file() else {}
        view.math_config = (_config(root / "math" / "runs", lambda c: isinstance(c.get("math"), dict)) or {}).get(
            "math", {})
        replay = _config(root / "runs", lambda c: ((c.get("train") or {}).get("replay") or {}).get("enabled"))
        if replay:
            view.replay = {**replay["train"]["replay"], "variant": replay.get("variant") or replay["train"].get(
                "variant")}
        log = root / "math" / "base" / "model.log.json"
        view.math_model = _json(log) if log.is_file() else {}
        toy = root / "toy_sort" / contract.TOY_SORT_FILES["table_csv"]
        view.toy_sort = pd.read_csv(toy) if toy.is_file() else pd.DataFrame()
        return view

    def section(self, sid: str) -> dict | None:
        return self.sections.get(sid)


def _config(runs: Path, wanted) -> dict | None:
    """The first resolved run config (``<run>/config.yaml``) under ``runs`` for which ``wanted`` holds."""
    for path in sorted(runs.glob(f"*/{contract.RUN_CONFIG_FILE}")):
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ValueError(f"{path} is unreadable: {e}") from None
        if isinstance(data, dict) and wanted(data):
            return data
    return None
