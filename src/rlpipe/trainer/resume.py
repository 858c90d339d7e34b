"""Resume or start afresh: the one place that decides (``rlpipe train --resume auto``).

A run directory's ``checkpoints/`` (file names: ``rlpipe.contract``) holds ``last.pt``
(the learner's resumable checkpoint, written every ``train.checkpoint_every`` steps),
``FINGERPRINT`` (a hash of everything that defines the run) and, once the run has finished,
``FINISHED``. The policy:

=============  ===========================================================================
``--resume``   what happens
=============  ===========================================================================
``auto``       resume iff ``last.pt`` exists, ``FINISHED`` does not, and ``FINGERPRINT``
               equals this run's fingerprint (a crashed run of the same settings); otherwise
               start afresh. This is what the workflow's ``train_variant`` rule passes, so a
               ``--rerun-incomplete`` after a crash continues, while a finished run that is
               forced to rerun, or a run whose settings changed, starts over.
``never``      always start afresh (the default without the flag).
``always``     resume; fail with a clear error when there is no checkpoint or it belongs to
               other settings or to a finished run (bare ``--resume`` means this).
=============  ===========================================================================

Starting afresh deletes ``checkpoints/`` first, so a stale checkpoint can never be picked up
later. The fingerprint hashes *parsed* values (the variant's resolved ``train`` section, the
``model`` section, the variant name) with sorted keys, so reordering YAML keys changes nothing;
only their identity keys (``rlpipe.config.identity``): a timeout, a thread count or a logging
interval changes nothing computed, so raising one resumes the run. The inputs (base checkpoint or
HF model directory, dataset directory) enter by the content of their files (sha256, with names
relative to the directory), never by absolute path or modification time: a retrained base model
never continues a run that started from the old one, while a project directory that was moved or
copied resumes its runs. Each file's digest is kept between starts (``rlpipe.trainer.digest_cache``)
and read back only while the file's device, inode, size, mtime and ctime are unchanged, so a second
start reads no unchanged file again and a changed one always is: the fingerprint still holds the
digests alone.

Departure from the previous design: this decision used to live in the rule's shell code (and in
part in ``RunContext.restore``, ``Checkpoints.restore``); it moved here so that it has unit tests.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlpipe.config.identity import identity
from rlpipe.contract import CHECKPOINT_DIR, CHECKPOINT_FILE, FINGERPRINT_FILE, FINISHED_MARKER
from rlpipe.io import write_text
from rlpipe.trainer.digest_cache import DigestCache

ResumeMode = Literal["auto", "never", "always"]
RESUME_MODES: tuple[str, ...] = ("auto", "never", "always")


class ResumeError(RuntimeError):
    """``--resume always`` was asked for but there is nothing valid to resume."""


@dataclass(frozen=True)
class ResumeDecision:
    resume: bool
    reason: str


def _file_identity(path: Path, digests: DigestCache) -> dict[str, Any]:
    return {"sha256": digests.digest(path), "size": path.stat().st_size}


def _input_identity(path: str | Path | None, digests: DigestCache) -> Any:
    """A file's content identity; a directory's: each of its files (names relative to it) with theirs."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        return {str(f.relative_to(p)): _file_identity(f, digests) for f in sorted(p.rglob("*")) if f.is_file()}
    if not p.is_file():
        return {"missing": p.name}
    return _file_identity(p, digests)


def run_fingerprint(train: dict, model: dict, variant: str, base: str | Path | None = None,
                    dataset: str | Path | None = None, digests: DigestCache | None = None) -> str:
    """Hash of what defines a run: the identity keys of its settings (sorted keys: key order is
    irrelevant) and the content of its inputs (their files' digests, through ``digests``: by default
    the user's digest cache, ``DigestCache.default()``)."""
    digests = DigestCache.default() if digests is None else digests
    payload = {"train": identity(train, "train"), "model": identity(model, "model"), "variant": variant,
               "base": _input_identity(base, digests), "dataset": _input_identity(dataset, digests)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def decide(run_dir: str | Path, fingerprint: str, mode: ResumeMode) -> ResumeDecision:
    """Whether to resume the run in ``run_dir``; see the module docstring for the policy."""
    if mode not in RESUME_MODES:
        raise ValueError(f"--resume must be one of {RESUME_MODES}, got {mode!r}")
    run = Path(run_dir)
    if mode == "never":
        return ResumeDecision(False, "--resume never")
    if not (run / CHECKPOINT_FILE).is_file():
        why = f"no checkpoint at {run / CHECKPOINT_FILE}"
    elif (run / FINISHED_MARKER).exists():
        why = "the run in this directory had finished"
    elif _read(run / FINGERPRINT_FILE) != fingerprint:
        why = f"the checkpoint was written with other settings ({run / FINGERPRINT_FILE} differs)"
    else:
        return ResumeDecision(True, f"resuming from {run / CHECKPOINT_FILE} (same settings, unfinished)")
    if mode == "always":
        raise ResumeError(f"--resume always: cannot resume {run_dir}: {why}")
    return ResumeDecision(False, f"starting afresh: {why}")


def prepare(run_dir: str | Path, fingerprint: str, decision: ResumeDecision) -> None:
    """Make ``checkpoints/`` match the decision: wiped on a fresh start; fingerprint written."""

    ckpt = checkpoint_dir(run_dir)
    if not decision.resume and ckpt.exists():
        shutil.rmtree(ckpt)
    ckpt.mkdir(parents=True, exist_ok=True)
    write_text(Path(run_dir) / FINGERPRINT_FILE, fingerprint + "\n")


def mark_finished(run_dir: str | Path) -> None:
    write_text(Path(run_dir) / FINISHED_MARKER, "")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
