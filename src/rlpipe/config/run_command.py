"""``rlpipe run [TARGET ...] [--config-file F ...]``: the workflow's Snakemake command, built so that
targets and config files cannot be confused.

Snakemake's ``--configfile`` takes every word after it up to the next option, so
``snakemake --configfile config/study.yaml results/families/lr_sweep/report/family.json`` reads the
target as a second config file, and fails before the workflow's own code runs (a
``FileNotFoundError`` for a target not yet built, a ``UnicodeDecodeError`` for a parquet file): the
Snakefile gets no hook there. This command takes each config file by its own option, in any order
with the targets, checks that each is a YAML mapping, and runs
``snakemake --cores N --configfile F ... [SNAKEMAKE_ARGS] -- TARGET ...`` (printed first). Arguments
after ``--`` go to Snakemake unchanged (``--resources gpu=2``, ``--forcerun RULE`` ...).

The workflow itself refuses a config file that is not ``.yaml``/``.yml`` (one that Snakemake could
read, such as a JSON target that exists) with the same one line (``rlpipe.workflow.loading``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from rlpipe.config.base import ConfigError
from rlpipe.config.pipeline import load_yaml

CONFIG_SUFFIXES = (".yaml", ".yml")


def check_config_file(path: str) -> None:
    """A config file is a YAML mapping; anything else is most likely a target put after it."""
    if Path(path).suffix.lower() not in CONFIG_SUFFIXES:
        raise ConfigError(f"{path}: looks like a target; put targets before --configfile "
                          f"(config files end in {' or '.join(CONFIG_SUFFIXES)})")
    load_yaml(path)  # exists, parses, a mapping: errors name the file


def check_target(target: str) -> None:
    if Path(target).suffix.lower() in CONFIG_SUFFIXES:
        raise ConfigError(f"{target}: looks like a config file, not a target; pass it with --config-file")


def build_command(targets: list[str], config_files: list[str], cores: str, dry_run: bool,
                  extra: list[str]) -> list[str]:
    """The Snakemake command line: options first, then ``--`` and the targets."""
    for f in config_files:
        check_config_file(f)
    for t in targets:
        check_target(t)
    cmd = [sys.executable, "-m", "snakemake", "--cores", cores]
    cmd += ["--dry-run"] if dry_run else []
    cmd += ["--configfile", *config_files] if config_files else []
    cmd += extra
    return cmd + (["--", *targets] if targets else [])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlpipe run", description="Run the workflow (Snakemake) on targets and config overlays, in any order; "
        "arguments after -- go to Snakemake.")
    p.add_argument("targets", nargs="*", help="files to build (default: the whole workflow)")
    p.add_argument("--config-file", "--configfile", dest="config_files", action="append", default=[],
                   metavar="FILE", help="a YAML overlay on config/config.yaml (repeat for several, merged in order)")
    p.add_argument("--cores", default="all", help="Snakemake --cores (default: all)")
    p.add_argument("-n", "--dry-run", action="store_true", help="plan only")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = _parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    try:
        cmd = build_command(args.targets, args.config_files, args.cores, args.dry_run, extra)
    except ConfigError as e:
        print(f"rlpipe run: {e}", file=sys.stderr)
        return 2
    print("+ " + shlex.join(["snakemake", *cmd[3:]]), file=sys.stderr, flush=True)
    os.execv(cmd[0], cmd)
    return 0  # not reached
