"""rlpipe.trainer.resume: the resume-or-start-afresh decision (``rlpipe train --resume auto``)."""

from __future__ import annotations

import pytest

from rlpipe.contract import CHECKPOINT_FILE, FINGERPRINT_FILE, FINISHED_MARKER
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


def test_operational_settings_leave_the_fingerprint_alone():
    """Raising a timeout (the troubleshooting page's remedy), a thread count or a logging interval
    resumes the run; an identity key starts it afresh."""
    fp = run_fingerprint(TRAIN, MODEL, "k4")
    for key, value in [("ray_timeout_s", 3600.0), ("threads", 4), ("checkpoint_every", 5), ("log_rollouts_every", 1)]:
        assert run_fingerprint({**TRAIN, key: value}, MODEL, "k4") == fp, key
    slower_sync = {**TRAIN, "weight_sync": {"transport": "object_store", "timeout_s": 999.0}}
    assert run_fingerprint(slower_sync, MODEL, "k4") == fp
    other_transport = {**TRAIN, "weight_sync": {"transport": "rdt", "timeout_s": 120.0}}
    assert run_fingerprint(other_transport, MODEL, "k4") != fp


def _project(root, template: str = "Q: {q}\n") -> dict:
    """A project directory's run inputs: base checkpoint, dataset, template file, reward file."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.jsonl").write_text('{"q": "1"}\n')
    (root / "data" / "val.jsonl").write_text('{"q": "2"}\n')
    (root / "model.pt").write_bytes(b"weights")
    (root / "t.txt").write_text(template)
    (root / "r.py").write_text("def f(r, g):\n    return 1.0\n")
    train = {**TRAIN, "text": {"template_file": str(root / "t.txt"), "reward": f"{root / 'r.py'}:f"}}
    return {"train": train, "model": MODEL, "variant": "k4", "base": root / "model.pt", "dataset": root / "data"}


def test_a_moved_or_copied_project_keeps_its_fingerprint(tmp_path):
    """Inputs enter by content: a copy elsewhere (new absolute paths, new mtimes) resumes."""
    fp = run_fingerprint(**_project(tmp_path / "a"))
    assert run_fingerprint(**_project(tmp_path / "elsewhere" / "b")) == fp
    assert run_fingerprint(**_project(tmp_path / "c", template="A: {q}\n")) != fp  # an edited template file


def test_fingerprint_changes_when_the_dataset_changes(tmp_path):
    inputs = _project(tmp_path)
    fp = run_fingerprint(**inputs)
    (tmp_path / "data" / "val.jsonl").write_text('{"q": "3"}\n')
    assert run_fingerprint(**inputs) != fp
