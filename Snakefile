# rlpipe: every GRPO experiment of the seeds, end to end.
#
#   snakemake --cores all                                  # CPU default (config/config.yaml)
#   snakemake --cores all --configfile config/gpu.yaml --resources gpu=2
#   snakemake --report report.html                         # the writeup
#   snakemake results/runs/k4/metrics.parquet              # one variant only
#
# Rules live in workflow/rules/*.smk, report captions in workflow/report/, operations notes in
# workflow/report/operations.rst.
from snakemake.utils import min_version, validate

from rlpipe.trainer.stop import forward_stop_signals

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"  # parses config with rlpipe.config: errors name the dotted key


# The generated JSON schema (same pydantic models) for Snakemake's own tooling; parse_config above has
# already rejected anything it would, with friendlier messages ("did you mean ...?").
validate(config, "workflow/schemas/config.schema.json")


include: "workflow/rules/setup.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/tracks.smk"
include: "workflow/rules/families.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/plots.smk"
include: "workflow/rules/cluster.smk"  # last: it gives every rule above its SLURM account and partition


report: "workflow/report/workflow.rst"


# SIGTERM or Ctrl-C to Snakemake reaches the running jobs' commands too (Snakemake alone would wait for
# them to finish): a training job then checkpoints and stops within seconds (rlpipe.trainer.stop).
# Snakemake keeps one onstart handler, and names the last one registered `onstart` (a function): an
# included file's runs first.
_included_onstart = globals().get("onstart")


onstart:
    if _included_onstart is not None:
        _included_onstart()
    forward_stop_signals()


localrules:
    all,


rule all:
    input:
        all_targets(),
    default_target: True
