"""What every driver loop shares: Ray start-up, guarded ``ray.get``, step logging, validation,
checkpoints and resume.

Driver-side conventions (the metrics are only comparable across variants because of these):
- ``step`` counts optimizer steps (1-based); row 0 is the initial validation (version 0).
- Phase events are keyed by optimizer step: a rollout batch's generation and scoring are charged
  to the first step that trains on it, a weight sync to the step after which it happens.
- ``time/wait`` is the time the driver is blocked on a rollout batch that is not ready yet: in a
  colocated run that is the whole generation; in a disaggregated run, the generation time that
  training did not hide. It overlaps actor phases and is not part of the phase stack.
- Validation runs on the generator, so it measures exactly the weights the generator holds: in
  colocated k-step runs that is at round ends (the first round end at or after each multiple of
  ``val_every``), plus step 0 and the final step.
- Within a round the drivers submit an actor's calls without waiting between them and ``get``
  the results in submission order, the order the actor runs them: the actor goes from one step to
  the next with no driver round trip, and the driver still logs each step and names the step of a
  failure. Rounds end at a sync point (validation, checkpoint, stop signal).

Failures (every message names the step; the resume advice is given only when a checkpoint exists):
- an actor that fails (``ActorFailure``) names its role (generator, learner, scorer, colocated
  worker), the call, the last completed optimizer step and the cause (``actor_errors``): the
  exception it raised at start-up or mid-run with the last frames of its traceback, or that its
  process was killed (and its log's last lines, when it printed any); an actor that does not
  answer within ``train.ray_timeout_s`` likewise, without a cause (it is still running);
- divergence in the learner (``TrainingDiverged``) names the step; nothing is checkpointed after it;
- an actor's failing checkpoint write or read (``OutputWriteError``, ``CheckpointError``) is
  re-raised in the driver as that type, naming the file, without the remote traceback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import ray

from rlpipe.analysis.contract import CHECKPOINT_FILE
from rlpipe.config import PipelineConfig, TrainConfig, to_dict
from rlpipe.io import OutputWriteError
from rlpipe.lm.checkpoint import CheckpointError, read_extra
from rlpipe.rl.records import PhaseEvent, RolloutBatch, UpdateResult, train_batches  # noqa: F401 (drivers' import)
from rlpipe.trainer.actors.learner import NonFiniteLossError
from rlpipe.trainer.drivers import actor_errors, actor_exit, placement
from rlpipe.trainer.drivers.progress import ProgressPrinter
from rlpipe.trainer.profiling import phase_split, seconds_by_phase
from rlpipe.trainer.run_writer import RunWriter
from rlpipe.trainer.stop import StopRequested, StopSignals, signal_name
from rlpipe.trainer.trackers import open_trackers
from rlpipe.trainer.weight_sync import WeightSyncError, ray_actor_class, sync_backend


class ActorFailure(RuntimeError):
    """An actor died or did not answer in time; the message names it and the step."""


class TrainingDiverged(RuntimeError):
    """The learner hit a NaN/inf loss, gradient, weight or log-prob; the message names the step."""


#: How long a failed run's advice waits for a checkpoint still being written (``checkpoint_on_disk``):
#: a save of the tiny models takes milliseconds, of a 1.5B model seconds; an actor that died with its
#: save leaves it unwritten, and the failure is then reported this much later.
CHECKPOINT_SETTLE_S = 10.0
#: what a failing actor is called in messages, by actor class
ROLES = {"ColocatedWorker": "colocated worker", "LearnerWorker": "learner",
         "GeneratorWorker": "generator", "Scorer": "scorer"}
#: an actor's key in run_info ``nodes`` (and ``gpu_fraction``), by actor class
NODE_KEYS = {"ColocatedWorker": "colocated", "LearnerWorker": "learner", "GeneratorWorker": "generator",
             "Scorer": "scorer"}
#: errors raised inside an actor that are re-raised in the driver as themselves (their message is
#: complete: it names the file), instead of Ray's wrapper with the remote traceback
_PASS_THROUGH = (CheckpointError, OutputWriteError)


@dataclass
class RunContext:
    cfg: PipelineConfig
    train: TrainConfig
    variant: str
    base_checkpoint: str
    dataset_dir: str | None
    out_dir: Path
    threads: int
    resume: bool
    tokenizer: str | None = None  # absolute tokenizer reference for the actors (None: the checkpoint's)
    writer: RunWriter = field(init=False)
    samples: int = 0
    tokens: int = 0
    pending_val: list = field(default_factory=list)

    def __post_init__(self):
        trackers = open_trackers(self.cfg.logging.trackers, self.out_dir, self.cfg.workflow.results_dir,
                                 self.variant, self.train.seed,
                                 {**to_dict(self.cfg), "train": to_dict(self.train), "variant": self.variant})
        self.writer = RunWriter(self.out_dir, trackers=trackers, flush_every_s=self.cfg.logging.flush_every_s)
        self.sizes = self.train.derived()
        self.driver_events: list[PhaseEvent] = []
        self._early_events: list[PhaseEvent] = []  # drained before their step's row exists
        self.step = 0  # last optimizer step whose result the driver has
        self.checkpoint_step: int | None = None  # step of the checkpoint on disk (this run's)
        self._unconfirmed: int | None = None  # step of a checkpoint the learner may still be writing
        self.loop_started = time.time()  # when the training loop began (after start-up and restore)
        self.roles: dict[str, str] = {}  # actor id (hex) -> "learner actor (<variant>/LearnerWorker)"
        self.progress = ProgressPrinter(self.variant, self.sizes.total_optimizer_steps,
                                        versions=self.train.mode == "disaggregated")
        self.stop = StopSignals()  # rlpipe train installs its handlers (rlpipe.trainer.stop)
        self._new_versions: list = []
        self._procs: dict[str, object] = {}  # actor id (hex) -> ref to its (pid, node id)
        self._asks: dict[str, dict[str, float]] = {}  # role -> the Ray resources its actor asked for
        self._nodes: dict[str, tuple[str, object]] = {}  # actor id (hex) -> (run_info key, ref to its node)

    # -- Ray --------------------------------------------------------------------------------------
    def get(self, ref, what: str):
        """``ray.get`` with the configured timeout; a dead or stuck actor, a diverged learner and a
        failed checkpoint write become clear errors (see the module docstring)."""
        try:
            return ray.get(ref, timeout=self.train.ray_timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise ActorFailure(f"{what}: no answer from the {self._callee(ref)} within train.ray_timeout_s="
                               f"{self.train.ray_timeout_s}s (stuck or overloaded){self._where()}. "
                               f"{self.resume_advice()}") from e
        except ray.exceptions.RayActorError as e:
            dead = self._dead_actor(e) or e
            raise ActorFailure(self._failure(what, self.role_of(dead), dead)) from e
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, NonFiniteLossError):
                raise TrainingDiverged(f"{what}: {cause}. {self.checkpoint_state()}") from None
            if isinstance(cause, _PASS_THROUGH):
                raise type(cause)(f"{what}: {cause}") from None
            dead = self._dead_actor(e)  # a task that failed because an actor it read from died
            if dead is not None:
                raise ActorFailure(self._failure(what, self.role_of(dead), dead)) from e
            raise ActorFailure(self._failure(what, self._callee(ref), e)) from e

    def _failure(self, what: str, role: str, err: BaseException) -> str:
        """The message of an actor's failure: the case and the exception with the actor and the
        step, the last traceback frames (or log lines), then what to do (``actor_errors``)."""
        cause = self._node_loss(err) or actor_errors.describe(err)
        if self._unconfirmed is not None:  # its checkpoint thread may still be renaming last.pt
            actor_exit.wait_exited(self._procs.get(getattr(err, "actor_id", None) or ""))
        detail = "".join(f"\n    {ln}" for ln in cause.lines)
        return f"{what},{self._where()}: the {role} {cause.case}{detail}\n{cause.advice} {self.resume_advice()}"

    def role_of(self, err) -> str:
        """The actor an error comes from, e.g. ``learner actor (v/LearnerWorker)``."""
        return self.roles.get(getattr(err, "actor_id", None) or "", "actor (unknown)")

    def _callee(self, ref) -> str:
        """The actor a ref's task runs on (``ObjectRef.task_id().actor_id()``)."""
        try:
            return self.roles.get(ref.task_id().actor_id().hex(), "actor")
        except Exception:  # not an actor task's ref
            return "actor"

    def _where(self) -> str:
        return f" after optimizer step {self.step} of {self.sizes.total_optimizer_steps}"

    def checkpoint_on_disk(self) -> int | None:
        """The optimizer step of this run's checkpoint on disk, or None. Read from the file when the
        driver has not recorded it: an actor can die after its checkpoint's rename and before the
        ``save`` call returns to the driver, and the advice must match what is on disk. A save still
        in flight is waited for, up to ``CHECKPOINT_SETTLE_S``."""
        if self._unconfirmed is None:
            if self.checkpoint_step is not None and self.checkpoint_path.is_file():
                return self.checkpoint_step
            return self._step_on_disk()
        # a save still being written on the learner's thread when the run fails: give it a moment to
        # land (on a loaded machine the advice once said "no checkpoint" just before it appeared)
        deadline = time.time() + CHECKPOINT_SETTLE_S
        while True:
            step = self._step_on_disk()
            if step == self._unconfirmed or time.time() >= deadline:
                return step
            time.sleep(0.1)

    def _step_on_disk(self) -> int | None:
        if not self.checkpoint_path.is_file():
            return None
        try:
            return int(read_extra(self.checkpoint_path)["step"])
        except (CheckpointError, KeyError, TypeError, ValueError):
            return None  # unreadable (or mid-rename): not a checkpoint to resume from

    def resume_advice(self) -> str:
        step = self.checkpoint_on_disk()
        if step is not None:
            return f"Rerun with --resume to continue from {self.checkpoint_path} (optimizer step {step})"
        return (f"No checkpoint was written yet (train.checkpoint_every={self.train.checkpoint_every}): "
                "rerun without --resume to start afresh")

    def checkpoint_state(self) -> str:
        step = self.checkpoint_on_disk()
        if step is not None:
            return f"The checkpoint on disk, {self.checkpoint_path}, is from optimizer step {step}"
        return "No checkpoint of this run is on disk"

    def sync(self, transport, sender, receivers, step: int):
        """``transport.sync`` with a dead actor reported like ``get`` does (which one, the step)."""
        try:
            return transport.sync(sender, receivers, step)
        except WeightSyncError as e:
            dead = self._dead_actor(e)
            if dead is None:
                raise ActorFailure(f"weight sync after optimizer step {step}: {e}. {self.resume_advice()}") from e
            raise ActorFailure(self._failure(f"weight sync of step {step}'s weights", self.role_of(dead), dead)) from e

    def _dead_actor(self, err: BaseException):
        """The actor death behind ``err`` (through ``__cause__`` and Ray's ``cause``), if any: the
        innermost one of this run's actors (a receiver's task fails when the sender it reads from
        died; Ray wraps that death in the receiver's task error)."""
        found, seen = [], 0
        while err is not None and seen < 8:
            if isinstance(err, ray.exceptions.RayActorError):
                found.append(err)
            err, seen = err.__cause__ or getattr(err, "cause", None), seen + 1
        known = [f for f in found if getattr(f, "actor_id", None) in self.roles]
        return (known or found or [None])[-1]

    def wait_get(self, ref, what: str, step: int, version: int):
        start = time.time()
        out = self.get(ref, what)
        self.driver_events.append(PhaseEvent("wait", "driver", start, time.time(), step, version))
        return out

    def actor(self, cls, *, gpus: float, cpus: float, transport: str = "local", strategy=None, **kwargs):
        """The run's actor of class ``cls``; ``strategy``: a Ray scheduling strategy (a bundle of the
        run's placement group across nodes, ``placement.spread_group``)."""
        # named "<variant>/<class>" so operators (and tests) can find the actors of a run
        name = f"{self.variant}/{cls.__name__}"
        role = f"{ROLES.get(cls.__name__, cls.__name__)} actor ({name})"
        self._asks[role] = {"CPU": cpus, "GPU": gpus}
        if not self.cfg.ray.address:  # a local instance has what it was started with, no more
            placement.check(self._asks, ray.cluster_resources())
        opts = {"num_cpus": cpus, "num_gpus": gpus, "max_concurrency": 1, "name": name}
        if strategy is not None:
            opts["scheduling_strategy"] = strategy
        handle = ray_actor_class(cls, transport).options(**opts).remote(**kwargs)
        self.roles[handle._actor_id.hex()] = role
        self._procs[handle._actor_id.hex()] = actor_exit.where_ref(handle)
        self._nodes[handle._actor_id.hex()] = (NODE_KEYS.get(cls.__name__, cls.__name__), placement.node_ref(handle))
        return handle

    def actor_nodes(self) -> dict[str, dict[str, str]]:
        """Where each actor runs, by run_info key (``learner``, ``generator``, ...): its node record."""
        return {key: self.get(ref, f"the {key} actor's node") for key, ref in self._nodes.values()}

    def _node_loss(self, err: BaseException):
        """``actor_errors.node_lost``'s cause when ``err``'s actor ran on another node that is gone."""
        key_ref = self._nodes.get(getattr(err, "actor_id", None) or "")
        try:
            node = ray.get(key_ref[1], timeout=0) if key_ref else None
        except Exception:  # its node never answered: nothing known of where it ran
            return None
        if node is None or node["node_id"] == ray.get_runtime_context().get_node_id():
            return None
        unreachable = isinstance(err, ray.exceptions.ActorUnavailableError)
        return actor_errors.node_lost(node, actor_errors.NODE_LOSS_WAIT_S if unreachable else 0.0)

    # -- logging ----------------------------------------------------------------------------------
    def log_update(self, step: int, res: UpdateResult, batch: RolloutBatch) -> None:
        self.step = step
        self.samples += res.samples
        self.tokens += res.tokens
        self.writer.add_row({"step": step, "policy_version": res.version,
                             "wall_time": self.writer.rel(time.time()), "samples": self.samples,
                             "_tokens": res.tokens, **batch.reward_metrics, **res.metrics})
        if step == 1 or step % self.train.log_rollouts_every == 0 or step == self.sizes.total_optimizer_steps:
            items = [{"prompt": p, "response": r, "reward": float(w), "ground_truth": g}
                     for p, r, w, g in list(zip(batch.prompts, batch.responses, batch.rewards.tolist(),
                                                batch.ground_truths, strict=False))[:: batch.group_size][:4]]
            self.writer.add_rollouts(step, res.version, items)

    def log_sync(self, step: int, stats) -> None:
        self.writer.update_row(step, {"sync/bytes": float(stats.bytes), "sync/seconds": stats.seconds,
                                      "sync/gbps": stats.gbps})

    def finalize_steps(self, logs: list) -> None:
        """Attach phase seconds and throughput to rows; ``logs`` are actors' drained logs."""
        new = self.driver_events
        self.driver_events = []
        for phase_events, version_events in logs:
            new = new + list(phase_events)
            self.writer.add_versions(version_events)
            self._new_versions += [e for e in version_events if e.event in ("optimizer_step", "load_weights")]
        self.writer.add_events(new)
        # Disaggregated, the generator is a step ahead: its events for step s + 1 (and the driver's
        # wait for that batch) are drained in round s, before row s + 1 exists. They are kept for
        # the round that writes that row, else time/generate, time/score and time/wait read 0.
        events = self._early_events + new
        by_step: dict[int, list[PhaseEvent]] = {}
        for e in events:
            by_step.setdefault(e.step, []).append(e)
        rows = sorted(self.writer.rows, key=lambda r: r["step"])
        last = int(rows[-1]["step"]) if rows else -1
        self._early_events = [e for e in events if e.step > last]
        for prev, row in zip(rows, rows[1:], strict=False):
            if "_tokens" not in row:
                continue
            row.update(seconds_by_phase(by_step.get(int(row["step"]), [])))
            dt = max(row["wall_time"] - prev["wall_time"], 1e-9)
            row["perf/samples_per_s"] = (row["samples"] - prev["samples"]) / dt
            row["perf/tokens_per_s"] = row.pop("_tokens") / dt

    def end_round(self, first_step: int, step: int, next_batch: int, generator, learner) -> None:
        """After a round's steps are finalized: validation (on ``generator``), a checkpoint (of
        ``learner``) or a flush when one is due, then the progress lines of steps ``first_step..step``.
        After a stop signal (``rlpipe.trainer.stop``) the checkpoint is always written, then
        ``StopRequested`` ends the run."""
        stopping = self.stop.requested
        if self.validation_due(first_step, step):
            self.submit_validation(generator, step)
        if stopping or self.checkpoint_due(first_step, step):
            self.save_checkpoint(learner, step, next_batch)
            if stopping or step == self.sizes.total_optimizer_steps:
                self.confirm_checkpoint(learner)  # on disk before the run ends
        else:
            self.collect_validation()
            self.writer.flush_if_due()
        self.report(first_step, step)
        if stopping:
            raise StopRequested(f"stopped by {signal_name(self.stop.signum)} after optimizer step {step} of "
                                f"{self.sizes.total_optimizer_steps}", self.stop.signum)

    def report(self, first_step: int, last_step: int) -> None:
        """Progress lines for completed steps, with the version changes logged since the last call."""
        for e in sorted(self._new_versions, key=lambda e: e.wall_time):
            self.progress.version(e.who, e.version, self.writer.rel(e.wall_time))
        self._new_versions = []
        for row in sorted(self.writer.rows, key=lambda r: r["step"]):
            if first_step <= row["step"] <= last_step:
                self.progress.step(row)

    # -- validation -------------------------------------------------------------------------------
    def validation_due(self, first_step: int, last_step: int) -> bool:
        every = self.train.val_every
        crossed = any(s % every == 0 for s in range(first_step, last_step + 1))
        return crossed or last_step == self.sizes.total_optimizer_steps

    def submit_validation(self, generator, step: int) -> None:
        self.pending_val.append((step, generator.validate.remote(step)))

    def collect_validation(self) -> None:
        for step, ref in self.pending_val:
            means, _ = self.get(ref, f"validation at step {step}")  # reward/val_mean, val_format, val_answer
            self.writer.update_row(step, means)
        self.pending_val = []

    # -- checkpoints ------------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / CHECKPOINT_FILE

    def checkpoint_due(self, first_step: int, last_step: int) -> bool:
        every = self.train.checkpoint_every
        return any(s % every == 0 for s in range(first_step, last_step + 1)) or \
            last_step == self.sizes.total_optimizer_steps

    def save_checkpoint(self, learner, step: int, next_batch: int) -> None:
        """Snapshot the outputs, then the learner writes ``last.pt`` (the snapshot always covers the
        checkpoint's step; resume cuts it there). The learner refuses non-finite weights, and it
        only gets here after finite steps (divergence raises before). The learner writes the file
        on a thread (``rlpipe.trainer.actors.checkpoint_writer``): it is counted as written when
        the next save returns (each waits for the one before) or ``confirm_checkpoint`` does."""
        self.collect_validation()
        self.writer.flush(snapshot=True)
        self.get(learner.save.remote(str(self.checkpoint_path),
                                     {"step": step, "next_batch": next_batch, "samples": self.samples,
                                      "wall_time": self.writer.rel(time.time())}), f"checkpoint at step {step}")
        if self._unconfirmed is not None:
            self.checkpoint_step = self._unconfirmed
        self._unconfirmed = step

    def confirm_checkpoint(self, learner) -> None:
        """Wait until the learner's last checkpoint is on disk (its failure is raised here)."""
        if self._unconfirmed is not None:
            self.get(learner.wait_saved.remote(), f"checkpoint at step {self._unconfirmed}")
            self.checkpoint_step, self._unconfirmed = self._unconfirmed, None

    def restore(self, learner) -> tuple[int, int]:
        """(next rollout batch, last optimizer step) to continue from; (0, 0) on a fresh run."""
        if not (self.resume and self.checkpoint_path.exists()):
            return 0, 0
        since = time.time()  # the restore logs version events (load_weights): they belong after it
        extra = self.get(learner.restore.remote(str(self.checkpoint_path)), f"restore {self.checkpoint_path}")
        step = int(extra["step"])
        self.writer.resume_from(step, since)
        self.samples = int(extra["samples"])
        self.step = self.checkpoint_step = step
        self.loop_started = time.time()
        self.progress.started(step, self.writer.rel(time.time()))
        return int(extra["next_batch"]), step

    def begin(self, generator) -> None:
        """Row 0 with the initial validation; the run's clock starts after it, so wall times and
        throughput measure training, not Ray start-up and model loading."""
        self.writer.add_row({"step": 0, "policy_version": 0, "wall_time": 0.0, "samples": 0})
        self.submit_validation(generator, 0)
        self.collect_validation()
        self.writer.t0 = self.loop_started = time.time()
        self.report(0, 0)

    def run_info(self, devices: int, device_type: str, gpu_fraction: dict[str, float]) -> dict:
        ws = self.train.weight_sync
        return {"variant": self.variant, "mode": self.train.mode, "devices": devices,
                "device_type": device_type, "gpu_fraction": gpu_fraction, "threads": self.threads,
                "total_samples": self.samples,
                "total_optimizer_steps": self.sizes.total_optimizer_steps,
                "phase_split": phase_split(self.writer.rows),
                "transport": "local" if self.train.mode != "disaggregated" else ws.transport,
                "backend": sync_backend(ws) if self.train.mode == "disaggregated" else None, "k": self.train.k,
                "replay": self.train.replay.enabled, "config": to_dict(self.train), "nodes": self.actor_nodes()}
