# The unit tests that gate all training (the resolved config is written by common.smk). The repository
# path reaches the shell as a resource, not a param: a moved project directory reruns nothing.


if RUN_TESTS:  # workflow.run_tests, with a built-in track (common.smk)


    # lint: conda (no environment on purpose, see common.smk)
    rule run_unit_tests:
        # beside the math pretraining from the start, ahead of the keyword chain (40): started after
        # both pretrainings it left a core idle, as every training waits for it
        priority: 45
        output:
            res("tests", "junit.xml"),
        params:
            args=CFG.workflow.test_args,
        resources:
            repo=str(REPO),  # not a param: resources are no rerun trigger
        log:
            "logs/run_unit_tests/pytest.log",
        threads: 1  # the other core runs the math pretraining meanwhile (2-core default)
        shell:
            # pytest runs from the repository (its pyproject holds the markers); outputs and the
            # log are made absolute first because the workdir may be elsewhere (--directory).
            'out="$PWD/{output}"; log="$PWD/{log}"; cd {resources.repo} && '
            # rlpipe.watch: the output goes to the log; the console gets pytest's progress every 15 s
            'OMP_NUM_THREADS={threads} python -m rlpipe.watch "$log" tests -- '
            'python -m pytest {params.args} -p no:cacheprovider --junitxml="$out"'


# --------------------------------------------------------------------------- a run you can watch
# When jobs start, the console says how many will run and how long the last complete run here took
# (rlpipe.analysis.run_timing); each long job then prints its last line every 15 s (rlpipe.watch).
# When a run from the start succeeds, results/run_timing.json records its duration and the machine's
# conditions over it (rlpipe.trainer.conditions: the CPU time of Snakemake's process tree against
# the machine's, the training runs' own measure; contended by the same rule).
import datetime as _dt
from collections import Counter as _Counter

from rlpipe.analysis import run_timing
from rlpipe.contract import RUN_CONDITIONS_KEYS
from rlpipe.trainer import conditions as _conditions

_RUN_START = _conditions.sample()
# Snakemake keeps one onstart handler: this one calls the one common.smk registered before it.
_ONSTART_BEFORE = getattr(workflow, "_onstart", lambda log: None)


onstart:
    _ONSTART_BEFORE(log)
    _last = run_timing.sentence(run_timing.read(RESULTS))
    _todo = _Counter(job.rule.name for job in workflow.dag.needrun_jobs())
    _runs = _todo["train_variant"] + _todo["train_family_run"]
    print(f"rlpipe: {len(workflow.dag)} jobs to run, {_runs} of them training runs "
          "(Snakemake prints 'N of M steps done' as they finish; "
          f"each long job prints its last line, a training job its step and ETA, every 15 s). Expected from "
          f"the last complete run: {_last} Timings (speedups, the benchmarks) are answers only on a quiet "
          "machine.", file=sys.stderr, flush=True)


onsuccess:
    _rules = _Counter(job.rule.name for job in workflow.dag.needrun_jobs(exclude_finished=False))
    if run_timing.is_complete(_rules):
        _cores = slurm.run_cores(workflow)  # None under a cluster executor, which has no total
        _c = _conditions.measure(_RUN_START, run_cores=_cores)
        io.write_json(f"{RESULTS}/{run_timing.RUN_TIMING_FILE}", run_timing.record(
            _c.wall_s, dict(_rules), _cores, {k: getattr(_c, k) for k in RUN_CONDITIONS_KEYS},
            os.path.basename(CONFIG_FILE), _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")))
        print(f"rlpipe: {run_timing.sentence(run_timing.read(RESULTS))} Recorded in "
              f"{RESULTS}/{run_timing.RUN_TIMING_FILE}; the next run states it when it starts.",
              file=sys.stderr, flush=True)
