# Every track's chain, one rule per kind of run (common.smk: TRACKS, one path scheme, {tdir}):
# its dataset (the built-in tracks' own data rules in data.smk, or a user's dataset_command) ->
# tokenizer -> base model (unless the track names one) -> one GRPO run per variant -> evaluation of
# the base and each final policy -> the track's report section. Every command reads the track's own
# resolved pipeline config (TRACK_CONFIG_FILES), which reaches the shell as a resource for the
# reason CONFIG_FILE is a global (common.smk); params are the sections each stage reads.
#
# Result paths: the keyword track keeps results/{tokenizer,base,runs/<variant>}/ (the design card's
# results/runs/<variant>), the math track results/math/..., a user's track results/tracks/<name>/...
# Logs: logs/<rule>/<track subdir><name>.log, e.g. logs/train_variant/k2.log and
# logs/train_variant/math/onpolicy.log.
from rlpipe.config import variant_nodes as _variant_nodes


# lint: conda (no environment on purpose, see common.smk)
rule build_track_data:
    # A user's dataset_command, run from the repository root into a temporary directory that is
    # renamed into place only when the command succeeds (never a half-written dataset).
    output:
        directory(tdir_res("data")),
    wildcard_constraints:
        tdir=tdirs(lambda t: t.dataset_command is not None),
    params:
        command=lambda w, output: track_of(w).dataset_command.replace("{out}", f"{output[0]}.tmp"),
        tmp=lambda w, output: f"{output[0]}.tmp",
    group:
        PREPARE_GROUP
    log:
        "logs/build_track_data/{tdir}build_track_data.log",
    shell:
        "(rm -rf {params.tmp} && mkdir -p {params.tmp} && {params.command} && mv {params.tmp} {output}) > {log} 2>&1"


# lint: conda (no environment on purpose, see common.smk)
rule train_tokenizer:
    priority: 50  # the pretraining chains first: they are the longest paths to the runs
    input:
        corpus=lambda w: track_corpus_inputs(track_of(w)),
    output:
        tdir_res("tokenizer", "tokenizer.json"),
    wildcard_constraints:
        tdir=tdirs(trains_tokenizer),
    params:
        cfg=lambda w: canonical(ident(track_of(w).pipeline.tokenizer, "tokenizer")),
        corpus=lambda w: track_corpus(track_of(w)),
    resources:
        config=track_config,
    group:
        PREPARE_GROUP
    log:
        "logs/train_tokenizer/{tdir}train_tokenizer.log",
    shell:
        "python -m rlpipe.watch {log} train_tokenizer -- "
        "rlpipe train-tokenizer --config {resources.config} --corpus {params.corpus} --out {output}"


# lint: conda (no environment on purpose, see common.smk)
rule pretrain_base:
    priority: 50  # the pretraining chains first: they are the longest paths to the runs
    input:
        corpus=lambda w: track_corpus_inputs(track_of(w)),
        tokenizer=lambda w: track_tokenizer_inputs(track_of(w)),
    output:
        tdir_res("base", "model.pt"),
    wildcard_constraints:
        tdir=tdirs(lambda t: t.pretrains),
    params:
        cfg=lambda w: canonical({s: ident(getattr(track_of(w).pipeline, s), s) for s in ("model", "pretrain", "tokenizer")}),
        corpus=lambda w: track_corpus(track_of(w)),
        tokenizer=lambda w, input: input.tokenizer[0] if input.tokenizer else track_of(w).pipeline.tokenizer.path,
    threads: lambda w: track_of(w).pipeline.pretrain.threads
    resources:
        gpu=lambda w: pretrain_gpus(track_of(w)),
        env=lambda w: env_prefix(pretrain_gpus(track_of(w))),
        config=track_config,
    group:
        PREPARE_GROUP
    log:
        "logs/pretrain_base/{tdir}pretrain_base.log",
    benchmark:
        "benchmarks/pretrain_base/{tdir}pretrain_base.tsv"
    shell:
        # rlpipe.watch: the output goes to the log, and the console gets its last line every 15 s
        # {resources.env}: CUDA_VISIBLE_DEVICES empty where the job declares no GPU (pretrain.device auto)
        "{resources.env} python -m rlpipe.watch {log} 'pretrain {wildcards.tdir}base' -- "
        "rlpipe pretrain --config {resources.config} --corpus {params.corpus} --tokenizer {params.tokenizer} "
        "--out {output}"


# One GRPO training job per variant of a track (`rlpipe train`, the Ray trainer).
#
# Resources: `gpu` is what rlpipe.config.variant_gpus says (0 on a CPU config; 1 colocated / 2
# disaggregated on config/gpu.yaml), so `--resources gpu=N` bounds concurrent GPU jobs and the SLURM
# profile turns it into `--gpus`. Threads: a timed track's runs (the keyword track, a user's track
# unless `timed: false`) take workflow.threads_per_variant, handed to the trainer (`--threads`:
# torch threads per actor and the local Ray instance's CPUs follow from it); on the CPU default
# that equals the machine's cores, so Snakemake (which never runs jobs whose threads exceed
# --cores) runs them one at a time and their wall-clock comparisons hold. The math track's runs
# compare learning and take workflow.family_threads.
#
# Resume: a forced rerun (--forcerun train_variant, -f, -F) passes `--resume never` and starts afresh;
# otherwise `rlpipe train --resume auto` decides (rlpipe.trainer.resume): after a crash or a hard
# kill the next invocation (with --rerun-incomplete) continues from checkpoints/last.pt, but only if
# that checkpoint was written by an unfinished run with the same settings. The mode is a resource,
# not a param, so forcing one invocation does not make the next one rerun the variant.
# The checkpoint directory is not a declared output, so Snakemake leaves it alone when it deletes
# the outputs of a failed job.
# Nodes: a disaggregated variant spans workflow.nodes_per_disaggregated nodes (`nodes` -> --nodes, and
# --gpus-per-node through slurm_extra); rlpipe.ray_slurm starts Ray across them (with 1 it runs the command as it is).
# lint: conda (no environment on purpose, see common.smk)
rule train_variant:
    input:
        unpack(train_inputs),
    output:
        **{k: tdir_res("runs", "{variant}", f) for k, f in RUN_FILES.items()},
    params:
        train=lambda w: train_params(w)["train"],  # a change in the variant's settings reruns it
        base=lambda w: train_params(w)["base"],  # a given HF directory or checkpoint, or the track's base
        dataset=lambda w: train_params(w)["dataset"],
        run_dir=lambda w, output: os.path.dirname(output.metrics),
    resources:
        gpu=lambda w: variant_gpus(track_of(w).pipeline, w.variant),
        nodes=lambda w: _variant_nodes(track_of(w).pipeline, w.variant),  # > 1: across nodes (rlpipe.ray_slurm)
        slurm_extra=lambda w: slurm.gpus_per_node(variant_gpus(track_of(w).pipeline, w.variant),
                                                  _variant_nodes(track_of(w).pipeline, w.variant)),
        mem_mb=train_mem_mb,  # from the model's size, with a floor (rlpipe.slurm)
        runtime=train_runtime,  # minutes, from the steps and the model (rlpipe.slurm)
        resume=resume_mode,  # "never" when this invocation forces the job, else "auto"
        config=track_config,
    threads: lambda w: track_threads(track_of(w))
    log:
        "logs/train_variant/{tdir}{variant}.log",
    benchmark:
        "benchmarks/train_variant/{tdir}{variant}.tsv"
    shell:
        # rlpipe.watch: the console gets the run's last step line (step/total, ETA) every 15 s
        "python -m rlpipe.watch {log} 'train {wildcards.tdir}{wildcards.variant}' -- "
        "python -m rlpipe.ray_slurm --nodes {resources.nodes} -- "
        "rlpipe train --config {resources.config} --variant {wildcards.variant} --base {params.base} "
        "{params.dataset} --out {params.run_dir} --threads {threads} --resume {resources.resume}"


# lint: conda (no environment on purpose, see common.smk)
rule evaluate_model:
    # Zero-shot evaluation of a track's base model (seed 001 Problem 1) and of each variant's final
    # policy: per-example rewards and the three format/answer categories.
    input:
        unpack(eval_inputs),
    output:
        **{k: tdir_res("eval", "{model}", f) for k, f in EVAL_FILES.items()},
    wildcard_constraints:
        tdir=tdirs(lambda t: t.evaluate),
    params:
        cfg=lambda w: eval_params(w)["cfg"],
        checkpoint=lambda w: eval_params(w)["checkpoint"],
        dataset=lambda w: eval_params(w)["dataset"],
        size=lambda w: eval_params(w)["size"],
        out=lambda w, output: os.path.dirname(output.summary),
    threads: CFG.workflow.family_threads  # compares learning, not speed
    resources:
        gpu=eval_gpus,
        device=eval_device,  # where the track trains ('auto': CUDA only with GPUs declared); no rerun trigger
        config=track_config,
    log:
        "logs/evaluate_model/{tdir}{model}.log",
    benchmark:
        "benchmarks/evaluate_model/{tdir}{model}.tsv"
    shell:
        "python -m rlpipe.watch {log} evaluate_model -- "
        "rlpipe eval --config {resources.config} --checkpoint {params.checkpoint} --dataset {params.dataset} "
        "{params.size} --device {resources.device} --threads {threads} --out {params.out}"


# lint: conda (no environment on purpose, see common.smk)
rule report_track:
    input:
        unpack(track_report_inputs),
    output:
        eval_html=report(
            tdir_res("report", MATH_REPORT_FILES["eval_html"]),
            caption="../report/math_eval.rst",
            category="8 Tracks",
            subcategory="{tdir}",
            labels={"item": "zero-shot and final-policy evaluation"},
        ),
        learning=report(
            tdir_res("report", MATH_REPORT_FILES["learning_png"]),
            caption="../report/math_learning.rst",
            category="8 Tracks",
            subcategory="{tdir}",
            labels={"item": "format and answer reward vs step"},
        ),
        numbers=tdir_res("report", MATH_REPORT_FILES["math_json"]),
    wildcard_constraints:
        tdir=tdirs(lambda t: t.evaluate),
    params:
        evals=lambda w, input: [os.path.dirname(p) for p in input.evals],
        labels=lambda w: ["base", *track_of(w).pipeline.variants],
        runs=lambda w, input: [os.path.dirname(p) for p in input.runs],
        run_labels=lambda w: list(track_of(w).pipeline.variants),
        out=lambda w, output: os.path.dirname(output.numbers),
    resources:
        mem_mb=ANALYSIS_MEM_MB,
    group:
        ANALYSIS_GROUP
    log:
        "logs/report_track/{tdir}report_track.log",
    shell:
        "python -m rlpipe.watch {log} report_track -- "
        "rlpipe math-report --evals {params.evals} --labels {params.labels} --runs {params.runs} "
        "--run-labels {params.run_labels} --out {params.out}"


# A user's timed track compares its variants as the keyword track compares its own: its runs are
# aggregated (`rlpipe aggregate`: the summary table, and the computed discussion, opened by any
# partial run and any run whose reward stayed flat) and drawn with the keyword track's profiling,
# timeline and weight-sync figures (`rlpipe plot`), all in its section of the report. The benchmarks
# stay the keyword track's: they measure the machine, not a task.
# lint: conda (no environment on purpose, see common.smk)
rule aggregate_track:
    input:
        unpack(track_summary_inputs),
    output:
        **{k: tdir_res("summary", f) for k, f in SUMMARY_FILES.items()},
        table_html=report(
            tdir_res("summary", SUMMARY_REPORT_FILES["table_html"]),
            caption="../report/summary.rst",
            category="8 Tracks",
            subcategory="{tdir}",
            labels={"item": "systems comparison: summary table"},
        ),
        discussion_html=report(
            tdir_res("summary", SUMMARY_REPORT_FILES["discussion_html"]),
            caption="../report/discussion.rst",
            category="8 Tracks",
            subcategory="{tdir}",
            labels={"item": "systems comparison: discussion (computed from the data)"},
        ),
    wildcard_constraints:
        tdir=tdirs(user_timed),
    params:
        variants=lambda w: list(track_of(w).pipeline.variants),
        reference=lambda w: table_reference(track_of(w).pipeline),
        runs=lambda w, input: os.path.dirname(os.path.dirname(input.info[0])),
        out=lambda w, output: os.path.dirname(output.table_html),
    resources:
        mem_mb=ANALYSIS_MEM_MB,
    group:
        ANALYSIS_GROUP
    log:
        "logs/aggregate_track/{tdir}aggregate_track.log",
    shell:
        "rlpipe aggregate --runs {params.runs} --out {params.out} --variants {params.variants} "
        "--reference {params.reference} > {log} 2>&1"


for _kind in TRACK_FIGURES:

    # lint: conda (no environment on purpose, see common.smk)
    rule:
        name:
            f"plot_track_{_kind}"
        input:
            summary=[tdir_res("summary", f) for f in SUMMARY_FILES.values()],
            code=code_inputs("plot"),
        output:
            report(
                tdir_res("figures", figure_file(_kind)),
                caption=f"../report/{_kind}.rst",
                category="8 Tracks",
                subcategory="{tdir}",
                labels={"item": f"systems comparison: {FIGURES[_kind].title}"},
            ),
        wildcard_constraints:
            tdir=tdirs(user_timed),
        params:
            kind=_kind,
            summary=lambda w, input: os.path.dirname(input.summary[0]),
        resources:
            mem_mb=ANALYSIS_MEM_MB,
        group:
            ANALYSIS_GROUP
        log:
            f"logs/plot_track_{_kind}/{{tdir}}plot_track_{_kind}.log",
        shell:
            "rlpipe plot {params.kind} --summary {params.summary} --out {output} > {log} 2>&1"
