#!/usr/bin/env bash
# The whole workflow on one GPU, every job: the eight variants of config/gpu.yaml, the benchmarks,
# aggregation, the figures and the report, with the one-GPU overlay of docs/gpu-and-clusters.md.
#
#   bash benchmarks/gpu/run_workflow.sh [OUT_DIR]      # from the project root, on the GPU machine
#
# Steps, each under its own `timeout -k` (seconds from the environment, defaults below):
#   1. install (RLPIPE_INSTALL_TIMEOUT_S): only where Snakemake or Ray cannot be imported, the GPU
#      page's install lines: a venv (.venv-gpu) that sees the image's torch, and the wheels of
#      `rlpipe gpu-bundle .gpu-wheels --python 3.12 --no-bench` (RLPIPE_GPU_WHEELS: their folder);
#   2. the workflow (RLPIPE_WORKFLOW_TIMEOUT_S): snakemake --configfile config/gpu.yaml one-gpu.yaml
#      --cores 16 --resources gpu=1, in a fresh directory under results/gpu-workflow/ (or under
#      RLPIPE_GPU_RUN_DIR);
#   3. the report (RLPIPE_REPORT_TIMEOUT_S): snakemake --report on the same configs.
# Then it copies the run's timing (results/run_timing.json), every benchmark JSON (results/bench/) and
# status.json (each step's command, limit, exit status and seconds; the GPU; the commit) into
# OUT_DIR/benchmarks/gpu/workflow/<date>-<gpu>/, to commit, and the logs into OUT_DIR/logs/ (not to
# commit). OUT_DIR: the argument, else $OUT, else results/gpu-workflow/out. It exits with the first
# failed step's status (124 or 137: its time limit), after copying what there is.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
OUT_DIR=$(mkdir -p "${1:-${OUT:-results/gpu-workflow/out}}" && cd "${1:-${OUT:-results/gpu-workflow/out}}" && pwd)
WHEELS=${RLPIPE_GPU_WHEELS:-.gpu-wheels}
INSTALL_S=${RLPIPE_INSTALL_TIMEOUT_S:-240}
WORKFLOW_S=${RLPIPE_WORKFLOW_TIMEOUT_S:-600}
REPORT_S=${RLPIPE_REPORT_TIMEOUT_S:-120}
STAMP=$(date -u +%Y-%m-%d)
RUN=${RLPIPE_GPU_RUN_DIR:-$ROOT/results/gpu-workflow}/$(date -u +%Y%m%dT%H%M%SZ)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
SLUG=$(printf '%s' "${GPU:-unknown-gpu}" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')
DEST="$OUT_DIR/benchmarks/gpu/workflow/$STAMP-$SLUG"
STEPS=()
FAILED=0

step() {  # step NAME LIMIT_S CMD...: run CMD under timeout -k, record its status and seconds
    local name=$1 limit=$2 t0 rc
    shift 2
    echo "run_workflow: $name (limit ${limit} s): $*" >&2
    t0=$(date +%s.%N)
    timeout -k 20 "$limit" "$@"
    rc=$?
    STEPS+=("$(python3 -c 'import json, sys; print(json.dumps({"step": sys.argv[1], "limit_s": int(sys.argv[2]),
"rc": int(sys.argv[3]), "seconds": round(float(sys.argv[5]) - float(sys.argv[4]), 1), "command": sys.argv[6:]}))' \
        "$name" "$limit" "$rc" "$t0" "$(date +%s.%N)" "$@")")
    echo "run_workflow: $name: exit $rc" >&2
    [ "$rc" -ne 0 ] && [ "$FAILED" -eq 0 ] && FAILED=$rc
    return "$rc"
}

install() {  # the GPU page's install lines (docs/gpu-and-clusters.md: the wheel bundle)
    [ -d "$WHEELS" ] || { echo "run_workflow: no $WHEELS (rlpipe gpu-bundle $WHEELS --python 3.12 --no-bench)" >&2; return 3; }
    python3 -m venv --without-pip --system-site-packages .venv-gpu
    python3 -c 'import os, site, sys; d = site.getsitepackages(); b = site.getsitepackages([sys.base_prefix, sys.base_exec_prefix]); print("import site; list(map(site.addsitedir, %r))" % [p for p in d if p not in b and os.path.isdir(p)], *[p for p in d if p in b], sep="\n")' > "$(.venv-gpu/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/image.pth"
    . .venv-gpu/bin/activate
    python -m pip install --no-index --no-deps "$WHEELS"/*.whl
    python -m pip install --no-index --no-deps --no-build-isolation -e .
}

ready() { python3 -c 'import ray, snakemake, rlpipe' 2>/dev/null; }

collect() {  # what the run made, into OUT_DIR (also after a failed or timed-out step)
    mkdir -p "$DEST/bench" "$OUT_DIR/logs"
    [ -f "$RUN/results/run_timing.json" ] && cp "$RUN/results/run_timing.json" "$DEST/"
    cp "$RUN"/results/bench/*.json "$DEST/bench/" 2>/dev/null
    rmdir "$DEST/bench" 2>/dev/null
    [ -f "$RUN/report.html" ] && du -b "$RUN/report.html" | cut -f1 > "$OUT_DIR/logs/report_bytes.txt"
    tar -czf "$OUT_DIR/logs/workflow-logs.tar.gz" -C "$RUN" logs .snakemake/log 2>/dev/null
    python3 - "$DEST/status.json" "$GPU" "$(git rev-parse HEAD 2>/dev/null)" "$FAILED" "${STEPS[@]}" <<'EOF'
import datetime, json, os, sys
out, gpu, commit, failed, *steps = sys.argv[1:]
record = {"gpu": gpu or None, "commit": commit or None, "date": datetime.datetime.now(datetime.UTC).strftime(
    "%Y-%m-%d %H:%M UTC"), "exit": int(failed), "load_avg_end": os.getloadavg(), "cpus": os.cpu_count(),
    "steps": [json.loads(s) for s in steps]}
with open(out, "w") as f:
    json.dump(record, f, indent=1)
EOF
    echo "run_workflow: results in $DEST, logs in $OUT_DIR/logs (exit $FAILED)" >&2
}

mkdir -p "$RUN" "$DEST"
if ! ready; then
    if [ -x .venv-gpu/bin/python ] && (. .venv-gpu/bin/activate && ready); then
        . .venv-gpu/bin/activate
    else
        step install "$INSTALL_S" bash -c "$(declare -f install); WHEELS='$WHEELS' install" && . .venv-gpu/bin/activate
    fi
fi
if [ "$FAILED" -eq 0 ]; then
    cp -r config "$RUN/config"
    # the one-GPU overlay the docs give (docs/gpu-and-clusters.md, SLURM: one GPU for a disaggregated variant)
    printf 'workflow: {gpus_per_disaggregated: 1}\nvariants:\n  disagg_rdt: {weight_sync.backend: cuda_ipc}\n' \
        > "$RUN/config/one-gpu.yaml"
    cd "$RUN" || exit 1  # a fresh directory: every job runs
    SNAKEMAKE=(python3 -m snakemake -s "$ROOT/Snakefile" --configfile config/gpu.yaml config/one-gpu.yaml)
    step workflow "$WORKFLOW_S" "${SNAKEMAKE[@]}" --cores 16 --resources gpu=1 &&
        step report "$REPORT_S" "${SNAKEMAKE[@]}" --report report.html
    cd "$ROOT" || exit 1
fi
collect
exit "$FAILED"
