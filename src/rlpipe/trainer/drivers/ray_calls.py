"""The driver's calls to its actors, and their failures in words.

``RayCalls`` starts the run's actors (named ``<variant>/<class>``, placed, remembered by role) and
makes every blocking call to them: ``started`` (every actor started, bounded by
``train.actor_start_timeout_s``), ``get`` (``ray.get`` bounded by ``train.ray_timeout_s``) and
``sync`` (a weight sync). Every message names the step; the resume advice comes from the run's
``Checkpoints`` and is given only when a checkpoint exists:
- an actor that fails (``ActorFailure``) names its role (generator, learner, scorer, colocated
  worker), the call, the last completed optimizer step and the cause (``actor_errors``): the
  exception it raised at start-up or mid-run with the last frames of its traceback, or that its
  process was killed (and its log's last lines, when it printed any); an actor that does not
  start within ``train.actor_start_timeout_s``, or answer a call within ``train.ray_timeout_s``,
  likewise, without a cause (it is still running);
- divergence in the learner (``TrainingDiverged``) names the step; nothing is checkpointed after it;
- an actor's failing checkpoint write or read (``OutputWriteError``, ``CheckpointError``) is
  re-raised in the driver as that type, naming the file, without the remote traceback.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import ray

from rlpipe.config import TrainConfig
from rlpipe.io import OutputWriteError
from rlpipe.lm.checkpoint import CheckpointError
from rlpipe.trainer.actors.learner import NonFiniteLossError
from rlpipe.trainer.drivers import actor_errors, actor_exit, placement
from rlpipe.trainer.drivers.checkpoints import Checkpoints
from rlpipe.trainer.weight_sync import WeightSyncError, ray_actor_class


class ActorFailure(RuntimeError):
    """An actor died or did not answer in time; the message names it and the step."""


class TrainingDiverged(RuntimeError):
    """The learner hit a NaN/inf loss, gradient, weight or log-prob; the message names the step."""


#: what a failing actor is called in messages, by actor class
ROLES = {"ColocatedWorker": "colocated worker", "LearnerWorker": "learner",
         "GeneratorWorker": "generator", "Scorer": "scorer"}
#: an actor's key in run_info ``nodes`` (and ``gpu_fraction``), by actor class
NODE_KEYS = {"ColocatedWorker": "colocated", "LearnerWorker": "learner", "GeneratorWorker": "generator",
             "Scorer": "scorer"}
#: errors raised inside an actor that are re-raised in the driver as themselves (their message is
#: complete: it names the file), instead of Ray's wrapper with the remote traceback
_PASS_THROUGH = (CheckpointError, OutputWriteError)


class RayCalls:
    """The run's actors and the driver's blocking calls to them (see the module docstring).
    ``where``: the run's position in words (" after optimizer step s of n"), read at each failure."""

    def __init__(self, variant: str, train: TrainConfig, attached: bool, checkpoints: Checkpoints,
                 where: Callable[[], str]):
        self.variant, self.train, self.attached = variant, train, attached
        self.checkpoints, self.where = checkpoints, where
        self.roles: dict[str, str] = {}  # actor id (hex) -> "learner actor (<variant>/LearnerWorker)"
        self._procs: dict[str, object] = {}  # actor id (hex) -> ref to its (pid, node id)
        self._asks: dict[str, dict[str, float]] = {}  # role -> the Ray resources its actor asked for
        self._nodes: dict[str, tuple[str, object]] = {}  # actor id (hex) -> (run_info key, ref to its node)

    def get(self, ref, what: str, limit: tuple[str, float, float] | None = None):
        """``ray.get`` bounded by ``limit`` (the config key, its value, the seconds left of it; default
        ``train.ray_timeout_s``, all of it); a dead or stuck actor, a diverged learner and a failed
        checkpoint write become clear errors (see the module docstring)."""
        key, seconds, left = limit or ("train.ray_timeout_s", self.train.ray_timeout_s, self.train.ray_timeout_s)
        try:
            return ray.get(ref, timeout=left)
        except ray.exceptions.GetTimeoutError as e:
            raise ActorFailure(f"{what}: no answer from the {self._callee(ref)} within {key}="
                               f"{seconds}s (stuck or overloaded){self.where()}. "
                               f"{self.checkpoints.advice()}") from e
        except ray.exceptions.RayActorError as e:
            dead = self._dead_actor(e) or e
            raise ActorFailure(self._failure(what, self.role_of(dead), dead)) from e
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, NonFiniteLossError):
                raise TrainingDiverged(f"{what}: {cause}. {self.checkpoints.state()}") from None
            if isinstance(cause, _PASS_THROUGH):
                raise type(cause)(f"{what}: {cause}") from None
            dead = self._dead_actor(e)  # a task that failed because an actor it read from died
            if dead is not None:
                raise ActorFailure(self._failure(what, self.role_of(dead), dead)) from e
            raise ActorFailure(self._failure(what, self._callee(ref), e)) from e

    def sync(self, transport, sender, receivers, step: int):
        """``transport.sync`` with a dead actor reported like ``get`` does (which one, the step)."""
        try:
            return transport.sync(sender, receivers, step)
        except WeightSyncError as e:
            dead = self._dead_actor(e)
            if dead is None:
                raise ActorFailure(f"weight sync after optimizer step {step}: {e}. "
                                   f"{self.checkpoints.advice()}") from e
            raise ActorFailure(self._failure(f"weight sync of step {step}'s weights", self.role_of(dead), dead)) from e

    def actor(self, cls, *, gpus: float, cpus: float, transport: str = "local", strategy=None, **kwargs):
        """The run's actor of class ``cls``; ``strategy``: a Ray scheduling strategy (a bundle of the
        run's placement group across nodes, ``placement.spread_group``)."""
        # named "<variant>/<class>" so operators (and tests) can find the actors of a run
        name = f"{self.variant}/{cls.__name__}"
        role = f"{ROLES.get(cls.__name__, cls.__name__)} actor ({name})"
        self._asks[role] = {"CPU": cpus, "GPU": gpus}
        if not self.attached:  # a local instance has what it was started with, no more
            placement.check(self._asks, ray.cluster_resources())
        opts = {"num_cpus": cpus, "num_gpus": gpus, "max_concurrency": 1, "name": name}
        if strategy is not None:
            opts["scheduling_strategy"] = strategy
        handle = ray_actor_class(cls, transport).options(**opts).remote(**kwargs)
        self.roles[handle._actor_id.hex()] = role
        self._procs[handle._actor_id.hex()] = actor_exit.where_ref(handle)
        self._nodes[handle._actor_id.hex()] = (NODE_KEYS.get(cls.__name__, cls.__name__), placement.node_ref(handle))
        return handle

    def started(self) -> None:
        """Wait until every actor of the run has started (placed, its ``__init__`` done), at most
        ``train.actor_start_timeout_s`` in all (unset: ``train.ray_timeout_s``): from here on
        ``train.ray_timeout_s`` bounds each call, so a hung step fails in that time however slowly
        the actors started."""
        key, limit = self.start_limit()
        deadline = time.monotonic() + limit
        for ref in self._procs.values():
            self.get(ref, "actor start-up", (key, limit, max(0.0, deadline - time.monotonic())))

    def start_limit(self) -> tuple[str, float]:
        """What bounds the actors' start: ``train.actor_start_timeout_s``, unset ``train.ray_timeout_s``
        (the key to name in a message, its seconds)."""
        if self.train.actor_start_timeout_s is not None:
            return "train.actor_start_timeout_s", self.train.actor_start_timeout_s
        return "train.ray_timeout_s", self.train.ray_timeout_s

    def actor_nodes(self) -> dict[str, dict[str, str]]:
        """Where each actor runs, by run_info key (``learner``, ``generator``, ...): its node record."""
        return {key: self.get(ref, f"the {key} actor's node") for key, ref in self._nodes.values()}

    def role_of(self, err) -> str:
        """The actor an error comes from, e.g. ``learner actor (v/LearnerWorker)``."""
        return self.roles.get(getattr(err, "actor_id", None) or "", "actor (unknown)")

    def _failure(self, what: str, role: str, err: BaseException) -> str:
        """The message of an actor's failure: the case and the exception with the actor and the
        step, the last traceback frames (or log lines), then what to do (``actor_errors``)."""
        cause = self._node_loss(err) or actor_errors.describe(err)
        if self.checkpoints.unconfirmed is not None:  # its checkpoint thread may still be renaming last.pt
            actor_exit.wait_exited(self._procs.get(getattr(err, "actor_id", None) or ""))
        detail = "".join(f"\n    {ln}" for ln in cause.lines)
        return f"{what},{self.where()}: the {role} {cause.case}{detail}\n{cause.advice} {self.checkpoints.advice()}"

    def _callee(self, ref) -> str:
        """The actor a ref's task runs on (``ObjectRef.task_id().actor_id()``)."""
        try:
            return self.roles.get(ref.task_id().actor_id().hex(), "actor")
        except Exception:  # not an actor task's ref
            return "actor"

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
