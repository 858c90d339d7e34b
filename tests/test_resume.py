"""rlpipe.trainer.resume: the resume-or-start-afresh decision (``rlpipe train --resume auto``)."""

from __future__ import annotations

import pytest

from rlpipe.analysis.contract import CHECKPOINT_FILE, FINGERPRINT_FILE, FINISHED_MARKER
from rlpipe.trainer.resume import (
    ResumeDecision,
    ResumeError,
    decide,
    mark_finished,
    prepare,
    run_fingerprint,
)

TRAIN = {"learning_rate": 5e-4, "n_grpo_steps": 80, "weight_sync": {"transport": "object_store", "timeout_s": 120.0}}
MODEL = {"preset": "cpu-tiny", "overrides": {"num_layers": 1, "d_model": 32}}


def crashed_run(run_dir, fingerprint: str) -> None:
    """What a run killed after its first checkpoint leaves behind."""
    prepare(run_dir, fingerprint, ResumeDecision(False, "fresh"))
    (run_dir / CHECKPOINT_FILE).write_bytes(b"ckpt")


def test_fingerprint_ignores_key_order_but_not_values(tmp_path):
    fp = run_fingerprint(TRAIN, MODEL, "k4")
    reordered = {"weight_sync": {"timeout_s": 120.0, "transport": "object_store"}, "n_grpo_steps": 80,
                 "learning_rate": 5e-4}
    assert run_fingerprint(reordered, {"overrides": {"d_model": 32, "num_layers": 1}, "preset": "cpu-tiny"}, "k4") == fp
    assert run_fingerprint({**TRAIN, "learning_rate": 1e-3}, MODEL, "k4") != fp
    assert run_fingerprint(TRAIN, MODEL, "k8") != fp


def test_fingerprint_changes_when_the_base_checkpoint_is_rebuilt(tmp_path):
    base = tmp_path / "model.pt"
    base.write_bytes(b"old base")
    fp = run_fingerprint(TRAIN, MODEL, "k4", base)
    base.write_bytes(b"a new, retrained base")
    assert run_fingerprint(TRAIN, MODEL, "k4", base) != fp


def test_crash_mid_run_with_same_settings_resumes(tmp_path):
    crashed_run(tmp_path, "abc")
    d = decide(tmp_path, "abc", "auto")
    assert d.resume and "resuming" in d.reason
    assert decide(tmp_path, "abc", "always").resume


def test_changed_settings_start_afresh_and_wipe_the_stale_checkpoint(tmp_path):
    crashed_run(tmp_path, "abc")
    d = decide(tmp_path, "xyz", "auto")
    assert not d.resume and "other settings" in d.reason
    prepare(tmp_path, "xyz", d)
    assert not (tmp_path / CHECKPOINT_FILE).exists()
    assert (tmp_path / FINGERPRINT_FILE).read_text().strip() == "xyz"


def test_finished_run_starts_afresh(tmp_path):
    crashed_run(tmp_path, "abc")
    mark_finished(tmp_path)
    d = decide(tmp_path, "abc", "auto")
    assert not d.resume and "finished" in d.reason
    prepare(tmp_path, "abc", d)
    assert not (tmp_path / FINISHED_MARKER).exists()


def test_no_checkpoint_starts_afresh(tmp_path):
    assert not decide(tmp_path, "abc", "auto").resume
    prepare(tmp_path, "abc", ResumeDecision(False, "fresh"))  # a first run: no checkpoint yet
    assert not decide(tmp_path, "abc", "auto").resume


def test_never_ignores_a_valid_checkpoint(tmp_path):
    crashed_run(tmp_path, "abc")
    assert not decide(tmp_path, "abc", "never").resume


@pytest.mark.parametrize("setup, why", [
    (lambda d: None, "no checkpoint"),
    (lambda d: (crashed_run(d, "abc"), mark_finished(d)), "finished"),
    (lambda d: crashed_run(d, "other"), "other settings"),
])
def test_always_fails_clearly_when_there_is_nothing_to_resume(tmp_path, setup, why):
    setup(tmp_path)
    with pytest.raises(ResumeError, match=why):
        decide(tmp_path, "abc", "always")


def test_unknown_mode_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="--resume"):
        decide(tmp_path, "abc", "maybe")
