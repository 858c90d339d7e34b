"""Run as a script by ``rlpipe bench startup``: ``rlpipe train`` in this process, with the moments
of its start-up written to ``$RLPIPE_STARTUP_STAMPS`` (JSON, seconds since the epoch).

It imports nothing of rlpipe before it stamps, and it patches only what every version of the
trainer calls, so the same probe times today's code and an older revision's (``--baseline``):
- ``imports``: ``rlpipe.trainer.run`` imported (with the interpreter's start before it);
- ``ray_init_start`` / ``ray_init_end``: around ``ray.init``;
- ``first_get``: the first ``ray.get`` that returns (the actors' first answer: the step-0 validation);
- ``first_step``: the row of optimizer step 1 added (``RunWriter.add_row``);
- ``shutdown_start`` / ``shutdown_end``: around ``ray.shutdown``; ``returned``: ``rlpipe train``
  returned (its last line printed); the bench stamps the process's end itself.
Modules are patched when they are imported (a meta-path hook), so the probe changes no import order.
"""

import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

STAMPS: dict[str, float] = {}


def mark(name: str) -> None:
    STAMPS.setdefault(name, time.time())


def _patch_ray(ray) -> None:
    init, get, shutdown = ray.init, ray.get, ray.shutdown

    def timed_init(*args, **kwargs):
        mark("ray_init_start")
        out = init(*args, **kwargs)
        mark("ray_init_end")
        return out

    def timed_get(*args, **kwargs):
        out = get(*args, **kwargs)
        mark("first_get")
        return out

    def timed_shutdown(*args, **kwargs):
        mark("shutdown_start")
        _write()  # a shutdown that hangs still leaves its stamps
        out = shutdown(*args, **kwargs)
        mark("shutdown_end")
        return out

    ray.init, ray.get, ray.shutdown = timed_init, timed_get, timed_shutdown


def _patch_run_writer(module) -> None:
    add_row = module.RunWriter.add_row

    def timed_add_row(self, row):
        out = add_row(self, row)
        if row.get("step") == 1:
            mark("first_step")
        return out

    module.RunWriter.add_row = timed_add_row


PATCHES = {"ray": _patch_ray, "rlpipe.trainer.run_writer": _patch_run_writer}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``PATCHES[name]`` on a module right after it is executed."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module

        def exec_and_patch(module):
            execute(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch
        return spec


def _write() -> None:
    path = os.environ.get("RLPIPE_STARTUP_STAMPS")
    if path:
        with open(path, "w") as f:
            json.dump(STAMPS, f)


def _stamped_exit(exit_now):
    def exit_after_stamps(code):
        mark("returned")
        _write()
        exit_now(code)

    return exit_after_stamps


def main(argv: list[str]) -> int:
    sys.meta_path.insert(0, _PatchOnImport())
    os._exit = _stamped_exit(os._exit)  # a command that ends its process itself (rlpipe.cli.train_main)
    importlib.import_module("rlpipe.trainer.run")
    mark("imports")
    rc = importlib.import_module("rlpipe.cli").main(["train", *argv])
    mark("returned")
    _write()
    return rc


if __name__ == "__main__":
    sys.path.pop(0)  # this script's folder (rlpipe/bench) is no place to import from
    sys.exit(main(sys.argv[1:]))
