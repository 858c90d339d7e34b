"""The generated configuration reference (rlpipe.config.reference): it names every key of the
config models with its type, default and bounds, and the checked-in docs page is current."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from rlpipe.config import PipelineConfig, TrainConfig
from rlpipe.config.reference import dotted_keys, main, render

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"


def test_checked_in_page_is_generated():
    assert PAGE.read_text() == render(), (
        "docs/configuration.md is stale; regenerate it with\n"
        "rlpipe config-reference --out docs/configuration.md")


def test_every_leaf_key_of_the_models_is_on_the_page():
    text = render()
    for name, field in TrainConfig.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):  # a subsection: its own table
            assert f"## `train.{name}`" in text and all(f"| `train.{name}.{k}` |" in text for k in sub.model_fields)
        else:
            assert f"| `train.{name}` |" in text, name
    for section in ("data", "tokenizer", "pretrain", "ray", "workflow", "logging"):
        cls = PipelineConfig.model_fields[section].annotation
        for name in cls.model_fields:
            assert f"| `{section}.{name}` |" in text, f"{section}.{name}"
    keys = dotted_keys()
    for key in ("train.weight_sync.transport", "train.replay.max_age", "math.arithmetic.slip_rate",
                "math.pretrain.max_steps", "families.<name>.replicates", "variants", "families"):
        assert key in keys and f"| `{key}` |" in text, key
    assert len(keys) == len(set(keys))


def test_rows_carry_type_default_bounds_and_description():
    text = render()
    row = next(line for line in text.splitlines() if line.startswith("| `train.val_every` |"))
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    field = TrainConfig.model_fields["val_every"]
    assert cells[1] == "int" and cells[2] == f"`{field.default}`" and cells[3] == "`>= 1`"
    assert cells[4] == field.description
    sampling = next(line for line in text.splitlines() if line.startswith("| `train.sampling_top_p` |"))
    assert "`> 0`, `<= 1`" in sampling
    betas = next(line for line in text.splitlines() if line.startswith("| `train.betas` |"))
    assert "each `>= 0`" in betas and "each `< 1`" in betas and "`[0.9, 0.95]`" in betas
    mode = next(line for line in text.splitlines() if line.startswith("| `train.mode` |"))
    assert '"colocated_sync" \\| "colocated_k" \\| "disaggregated"' in mode


def test_cli_writes_the_page(tmp_path):
    out = tmp_path / "ref.md"
    assert main(["--out", str(out)]) == 0
    assert out.read_text() == render()


def test_the_page_marks_operational_keys_and_the_model_override_fields():
    rows = {line.split("|")[1].strip(): line for line in render().splitlines() if line.startswith("| `")}
    assert "Operational: changing it reruns no job" in rows["`train.ray_timeout_s`"]
    assert "Operational" in rows["`tracks.<name>.pretrain.threads`"]
    assert "Operational" not in rows["`train.learning_rate`"]
    assert "`num_layers`" in rows["`model.overrides`"] and "`context_length`" in rows["`math.model.overrides`"]
