"""Mechanism checks (rlpipe.analysis.mechanism): a family whose mechanism was inactive says that its
comparison cannot answer the question at this scale, and names what would; an active one does not."""

import json
import math

import pandas as pd
import yaml

from rlpipe import contract
from rlpipe.analysis import families, mechanism

STEPS = 8


def _run(d, val, clip_frac=0.002, length=26.0):
    """A synthetic replicate over STEPS steps: validation reward ``val(step)``, a constant clip
    fraction and response length ``length(step)`` (a number or a function of the step)."""
    d.mkdir(parents=True, exist_ok=True)
    rows = []
    for step in range(STEPS + 1):
        row = {c: math.nan for c in contract.METRIC_COLUMNS}
        row.update(step=step, policy_version=step, wall_time=10.0 * step, samples=8 * step)
        row["reward/val_mean"] = val(step)
        if step:
            row.update({"loss/clip_frac": clip_frac, "policy/entropy": 1.0, "optim/grad_norm": 1.0,
                        "response/length_mean": length(step) if callable(length) else length,
                        "time/generate": 5.0, "time/update": 5.0})
        rows.append(row)
    df = pd.DataFrame(rows, columns=list(contract.METRIC_COLUMNS))
    df.astype({c: "int64" for c in contract.METRIC_INT_COLUMNS}).to_parquet(d / contract.METRICS_FILE)
    info = {"variant": d.parent.name, "mode": "colocated_sync", "devices": 1, "device_type": "cpu",
            "wall_time_s": 80.0, "total_samples": 64, "total_optimizer_steps": STEPS, "finished": True,
            "config": {"seed": 0, "val_size": 64}}
    (d / contract.RUN_INFO_FILE).write_text(json.dumps(info))


def _family(tmp_path, variants: dict[str, dict], **run_kw):
    cfg = {"workflow": {"tracks": ["keyword"]},
           "families": {"fam": {"track": "keyword", "question": "Q?", "base": {"n_grpo_steps": STEPS},
                                "replicates": 2, "variants": variants}}}
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    runs = []
    for v in variants:
        for seed in range(2):
            d = tmp_path / "runs" / v / f"seed{seed}"
            kw = {k: (f[v] if isinstance(f, dict) else f) for k, f in run_kw.items()}
            _run(d, **kw)
            runs.append((v, seed, str(d)))
    return families.load_family(str(tmp_path / "c.yaml"), "fam", runs)


CLIP = {"clip": {"loss_type": "grpo_clip"}, "no_clip": {"loss_type": "grpo_no_clip"}}


def rising(step):
    return 0.1 + 0.08 * step  # 0.1 -> 0.74: no saturation


def test_inactive_clip_says_the_comparison_cannot_answer(tmp_path):
    fam = _family(tmp_path, CLIP, val=rising, clip_frac=0.003)
    assert mechanism.varied(fam) == {"loss_type"}
    _, sentences = families.discussion(fam)
    text = " ".join(sentences)
    assert "cannot answer whether the clip matters at this scale" in text
    assert "clip 0.3%" in text and "learning_rate" in text and "epochs_per_rollout_batch" in text


def test_active_clip_or_another_family_gets_no_clip_sentence(tmp_path):
    fam = _family(tmp_path / "active", CLIP, val=rising, clip_frac=0.05)
    assert mechanism.clip_sentences(fam) == []
    other = {"a": {"learning_rate": 1e-4}, "b": {"learning_rate": 1e-3}}
    fam = _family(tmp_path / "lr", other, val=rising, clip_frac=0.0)
    assert mechanism.clip_sentences(fam) == []


def test_early_saturation_is_named(tmp_path):
    sat = _family(tmp_path / "sat", CLIP, val=lambda s: 0.5 if s == 0 else 0.97, clip_frac=0.05)
    text = " ".join(families.discussion(sat)[1])
    assert "the validation reward saturates early" in text and "clip by step 1 of 8" in text
    late = _family(tmp_path / "late", CLIP, val=lambda s: 0.97 if s == STEPS else 0.5, clip_frac=0.05)
    assert mechanism.saturation_sentences(late) == []


def test_steady_length_makes_length_normalisation_a_step_size(tmp_path):
    norm = {"masked_mean": {"length_normalization": "masked_mean"},
            "masked_normalize": {"length_normalization": "masked_normalize"}}
    fam = _family(tmp_path / "steady", norm, val=rising, length=lambda s: 26.0 + 0.1 * s)
    text = " ".join(families.discussion(fam)[1])
    assert "a smaller step size rather than another weighting" in text and "between 26.1 and 26.8 tokens" in text
    fam = _family(tmp_path / "varied", norm, val=rising, length=lambda s: 10.0 * s)
    assert mechanism.length_sentences(fam) == []


def test_groups_without_signal_are_named(tmp_path):
    fam = _family(tmp_path / "flat", CLIP, val=rising, clip_frac=0.05)
    for r in fam.runs:
        r.run.metrics.loc[r.run.metrics["step"] >= 1, "reward/zero_std_frac"] = 0.9
    text = " ".join(families.discussion(fam)[1])
    assert "in most groups every response got the same reward" in text and "clip 90%" in text
    for r in fam.runs[:2]:  # control: one variant with signal in most groups
        r.run.metrics.loc[r.run.metrics["step"] >= 1, "reward/zero_std_frac"] = 0.3
    assert mechanism.signal_sentences(fam) == []
