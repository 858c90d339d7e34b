"""``python tests/parse_counts.py [snakemake args]``: ``snakemake --list`` on this workflow, printing
as its last line (JSON) how many times the parse called rlpipe.config's per-run work: each call
of ``apply_overrides`` (every variant's, track's and family's settings are resolved through it),
``family_pipeline`` and ``track_pipeline``. Counts, not time: tests/test_workflow_parse_work.py."""

from __future__ import annotations

import atexit
import json
import sys

import rlpipe.config as config
import rlpipe.config.pipeline as pipeline

COUNTED = ("apply_overrides", "family_pipeline", "track_pipeline")
counts = dict.fromkeys(COUNTED, 0)


def _counting(name: str, real):
    def wrapper(*args, **kwargs):
        counts[name] += 1
        return real(*args, **kwargs)
    return wrapper


for _name in COUNTED:  # before the workflow imports them: the module and the package's re-export
    _wrapped = _counting(_name, getattr(pipeline, _name))
    setattr(pipeline, _name, _wrapped)
    if hasattr(config, _name):
        setattr(config, _name, _wrapped)

if __name__ == "__main__":
    from snakemake.cli import main

    atexit.register(lambda: print(json.dumps(counts), flush=True))
    sys.argv = ["snakemake", "--list", *sys.argv[1:]]
    main()
