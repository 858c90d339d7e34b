"""``logging.trackers: [wandb]``: one Weights & Biases run per training run.

Named by ``rlpipe.trainer.trackers.naming``: project ``$WANDB_PROJECT`` (default ``rlpipe``), the
entity W&B takes from ``$WANDB_ENTITY`` or the login, group ``<track>`` or ``families/<family>`` (a
family's replicates group together), job type the variant, name ``<group>/<variant>/seed<seed>``,
tags the track or family, variant and seed. It holds the resolved config (``config.yaml``'s
content, plus an ``rlpipe`` entry with the names above), every metric at its optimizer step, and at
the end ``run_info.json`` and the run's figures (files, the curves also as an image in the summary).

Mode: ``$WANDB_MODE`` when set; otherwise online only where there is a W&B API key and the server
answers within a few seconds, else offline. An offline run lives in ``<run>/wandb/offline-run-*``
and ``wandb sync <that directory>`` uploads it later. The run id is the run's tracker key
(``rlpipe.trainer.trackers.state``) with ``resume="allow"``, so a resumed training run continues its
W&B run. W&B's console capture and system metrics are off: the run's log stays the trainer's own, and
no sampling thread competes with training. Needs ``pip install -e '.[wandb]'``.
"""

from __future__ import annotations

import netrc
import os
import shutil
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rlpipe.trainer.trackers.base import RunSpec, metric_items

DEFAULT_PROJECT = "rlpipe"
_PROBE_S = 3.0  # seconds the server has to answer before a run without WANDB_MODE goes offline


def _has_api_key(host: str) -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def default_mode() -> str:
    """``$WANDB_MODE``, else ``online`` with a key and a reachable server, else ``offline``."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    url = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    host = url.hostname or "api.wandb.ai"
    if not _has_api_key(host):
        return "offline"
    try:
        with socket.create_connection((host, url.port or (443 if url.scheme == "https" else 80)), timeout=_PROBE_S):
            return "online"
    except OSError:
        return "offline"


class WandbTracker:
    name = "wandb"
    wants_files = True

    def __init__(self) -> None:
        self.run: Any = None

    def open(self, spec: RunSpec) -> None:
        import wandb

        config = {**spec.config, "rlpipe": {"track": spec.track, "family": spec.family, "variant": spec.variant,
                                            "seed": spec.seed, "run_dir": str(spec.run_dir)}}
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_git=True,
                                  save_code=False, x_save_requirements=False, disable_job_creation=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, group=spec.group, job_type=spec.variant,
            name=spec.name, tags=[spec.group, spec.variant, f"seed{spec.seed}"], id=spec.key, resume="allow",
            dir=str(spec.run_dir), mode=default_mode(), config=config, settings=settings, reinit="create_new")

    def log_rows(self, rows: list[dict]) -> None:
        for row in rows:
            self.run.log(dict(metric_items(row)), step=int(row["step"]))

    def finish(self, files: list[Path], ok: bool) -> None:
        import wandb

        for f in files:
            if f.is_file():
                shutil.copy2(f, Path(self.run.dir) / f.name)  # the run's files directory: uploaded by sync
                self.run.save(str(Path(self.run.dir) / f.name), base_path=self.run.dir, policy="now")
                if f.suffix == ".png":
                    self.run.summary[f"figures/{f.stem}"] = wandb.Image(str(f))
        self.run.finish(exit_code=0 if ok else 1)
