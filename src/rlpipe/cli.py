"""``rlpipe``: a thin dispatcher; each subcommand is a module's ``main(argv)``."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys

from rlpipe.config import json_schema

COMMANDS = {
    "build-corpus": ("rlpipe.tasks.keyword.corpus", "main"),
    "train-tokenizer": ("rlpipe.lm.tokenizer", "train_tokenizer_main"),
    "pretrain": ("rlpipe.lm.pretrain", "main"),
    "import-base": ("rlpipe.lm.pretrain", "import_base_main"),
    "export-hf": ("rlpipe.lm.hf_export", "main"),
    "build-decode": ("rlpipe.lm.decode_package", "main"),
    "build-dataset": ("rlpipe.tasks.keyword.dataset", "main"),
    "build-math-data": ("rlpipe.tasks.math.arithmetic", "main"),
    "eval-base": ("rlpipe.tasks.keyword.eval", "main"),
    "eval": ("rlpipe.trainer.evaluate", "main"),
    "train": ("rlpipe.cli", "train_main"),
    "aggregate": ("rlpipe.analysis.aggregate", "main"),
    "plot": ("rlpipe.analysis.plots", "main"),
    "math-report": ("rlpipe.analysis.math_report", "main"),
    "family-report": ("rlpipe.analysis.families", "main"),
    "toy-sort": ("rlpipe.tasks.sorting.experiment", "main"),
    "toy-sort-report": ("rlpipe.analysis.toy_sort", "main"),
    "scaling-report": ("rlpipe.analysis.scaling", "main"),
    "results-page": ("rlpipe.analysis.results_page", "main"),
    "schema": ("rlpipe.cli", "schema_main"),
    "config-reference": ("rlpipe.config.reference", "main"),
    "run": ("rlpipe.config.run_command", "main"),
    "gpu-check": ("rlpipe.bench.gpu_check", "main"),
    "gpu-report": ("rlpipe.bench.gpu_report", "main"),
    "gpu-bundle": ("rlpipe.bench.gpu_bundle", "main"),
}
BENCHES = {"sampler": "rlpipe.bench.sampler", "update": "rlpipe.bench.update", "scaling": "rlpipe.bench.scaling",
           "weight-sync": "rlpipe.bench.weight_sync", "trl": "rlpipe.bench.trl", "trackers": "rlpipe.bench.trackers",
           "pretrain-precision": "rlpipe.bench.pretrain_precision", "startup": "rlpipe.bench.startup"}


def schema_main(argv: list[str]) -> int:
    """The config's JSON schema, as JSON: Snakemake reads a JSON file with the json module before it
    tries YAML, in every process that parses the workflow (each cluster job twice)."""
    print(json.dumps(json_schema(), indent=2))
    return 0


def train_main(argv: list[str]) -> int:
    """``rlpipe train`` (``rlpipe.trainer.run``), then, after a finished run, its flat-reward diagnosis
    (``rlpipe.analysis.flat_reward``) as the last log line: the diagnosis is analysis, which the
    trainer does not import, so the command that runs both joins them here.

    Once the trainer has returned (its outputs written, its Ray instance shut down) the process ends
    at once (``os._exit``, after flushing its output): the interpreter's own teardown of torch and Ray
    takes seconds of a job's start-up budget and does nothing a run needs. (In-process callers use
    ``rlpipe.trainer.run`` itself.)"""
    train = importlib.import_module("rlpipe.trainer.run")
    args = train.parser().parse_args(argv)  # bad arguments exit 2 here, as in the trainer's own parse
    rc = train.main(argv)
    if rc == 0:
        flat = importlib.import_module("rlpipe.analysis.flat_reward")
        print(flat.run_log_line(args.out, args.variant) or "validation reward: rose beyond its noise, or too few "
              "validation points to tell", flush=True)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def _usage() -> str:
    cmds = "\n".join(f"  {c}" for c in list(COMMANDS) + [f"bench {b}" for b in BENCHES])
    return f"usage: rlpipe COMMAND [ARGS]   (rlpipe COMMAND --help)\ncommands:\n{cmds}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "bench":
        if not rest or rest[0] not in BENCHES:
            print(f"rlpipe bench: choose one of {sorted(BENCHES)}", file=sys.stderr)
            return 2
        module, func, rest = BENCHES[rest[0]], "main", rest[1:]
    elif cmd in COMMANDS:
        module, func = COMMANDS[cmd]
    else:
        print(f"rlpipe: unknown command {cmd!r}\n{_usage()}", file=sys.stderr)
        return 2
    rc = getattr(importlib.import_module(module), func)(rest)
    return rc if isinstance(rc, int) else 0  # some mains return their result (e.g. a bench's JSON)


if __name__ == "__main__":
    sys.exit(main())
