# Experiment families: family x variant x seed -> one `rlpipe train` job each, then one
# report section per family (`rlpipe family-report`). Adding a family is one entry in the config's
# `families` table; nothing here names a family or a variant.
#
# Rerun one replicate from scratch:
#   snakemake --cores all --forcerun train_family_run -- results/families/<family>/runs/<variant>/seed<seed>/metrics.parquet
# (a replicate that is a variants-table run, the systems family's first seed, is results/runs/<variant>:
#   snakemake --cores all --forcerun train_variant -- results/runs/<variant>/metrics.parquet)
# Each family runs on its own resolved pipeline config (FAMILY_CONFIG_FILES, common.smk). It reaches
# the shell as a resource, not a param, for the reason CONFIG_FILE is a global: its path changes with
# any config edit, while `params.train` (the replicate's resolved settings) reruns exactly the
# replicates whose settings changed. Threads: workflow.family_threads (1 on the CPU default, so two
# replicates share the 2 cores; their timings are flagged contended and the family report draws no
# timing conclusion from them, see rlpipe.config.WorkflowConfig.family_threads), except on the
# systems track, whose replicates compare speed and run alone (family_threads, common.smk).


# lint: conda (no environment on purpose, see common.smk)
rule train_family_run:
    input:
        unpack(family_train_inputs),
    output:
        **family_run_outputs("{family}", "{fvariant}", "{fseed}"),
    params:
        train=family_variant_train,  # a change in the replicate's settings reruns it
        base=family_base,
        dataset=family_dataset_arg,
        run_dir=lambda w, output: os.path.dirname(output.metrics),
    resources:
        gpu=lambda w: variant_gpus(FAMILY_CFG[w.family], w.fvariant),
        mem_mb=family_mem_mb,  # as train_variant's (rlpipe.slurm)
        runtime=family_runtime,
        resume=family_resume_mode,
        config=lambda w: FAMILY_CONFIG_FILES[w.family],
    threads: family_threads
    log:
        "logs/train_family_run/{family}/{fvariant}/seed{fseed}.log",
    benchmark:
        "benchmarks/train_family_run/{family}/{fvariant}/seed{fseed}.tsv"
    shell:
        # rlpipe.watch: the console gets the run's last step line (step/total, ETA) every 15 s
        "python -m rlpipe.watch {log} '{wildcards.family} {wildcards.fvariant} seed {wildcards.fseed}' -- "
        "rlpipe train --config {resources.config} --variant {wildcards.fvariant} --seed {wildcards.fseed} "
        "--base {params.base} {params.dataset} --out {params.run_dir} --threads {threads} "
        "--resume {resources.resume}"


# lint: conda (no environment on purpose, see common.smk)
# lint: CONFIG_FILE (a global, not a param: see common.smk)
rule report_family:
    input:
        unpack(family_report_inputs),
    output:
        curves=report(
            family_res("{family}", FAMILY_REPORT_DIR, FAMILY_REPORT_FILES["curves"]),
            caption="../report/family_curves.rst",
            category="9 Experiment families",
            subcategory="{family}",
            labels={"family": "{family}", "item": "validation reward (mean, 95% band)"},
        ),
        health=report(
            family_res("{family}", FAMILY_REPORT_DIR, FAMILY_REPORT_FILES["health"]),
            caption="../report/family_health.rst",
            category="9 Experiment families",
            subcategory="{family}",
            labels={"family": "{family}", "item": "GRPO health signals"},
        ),
        discussion=report(
            family_res("{family}", FAMILY_REPORT_DIR, FAMILY_REPORT_FILES["discussion"]),
            caption="../report/family_discussion.rst",
            category="9 Experiment families",
            subcategory="{family}",
            labels={"family": "{family}", "item": "table and discussion (computed)"},
        ),
        table=family_res("{family}", FAMILY_REPORT_DIR, FAMILY_REPORT_FILES["table"]),
        numbers=family_res("{family}", FAMILY_REPORT_DIR, FAMILY_REPORT_FILES["numbers"]),
    params:
        family=lambda w: canonical(to_dict(CFG.families[w.family])),  # its metadata: a change redraws it
        runs=lambda w, input: [os.path.dirname(p) for p in input.metrics],
        variants=lambda w: [v for v, _ in family_runs(w.family)],
        seeds=lambda w: [s for _, s in family_runs(w.family)],
        out=lambda w, output: os.path.dirname(output.numbers),
    resources:
        mem_mb=ANALYSIS_MEM_MB,
    group:
        ANALYSIS_GROUP
    log:
        "logs/report_family/{family}.log",
    shell:
        "python -m rlpipe.watch {log} report_family -- "
        "rlpipe family-report --config {CONFIG_FILE} --family {wildcards.family} --runs {params.runs} "
        "--variants {params.variants} --seeds {params.seeds} --out {params.out}"


# Seed 003's toy-sorting lecture as a replicated grid: every delta mode x loss mode on
# workflow.toy_sort_seeds (seconds per run, no Ray).
# lint: conda (no environment on purpose, see common.smk)
rule run_toy_sort:
    input:
        code=code_inputs("toy-sort", "toy-sort-report"),
    output:
        curves=report(
            res("toy_sort", TOY_SORT_FILES["curves"]),
            caption="../report/toy_sort.rst",
            category="9 Experiment families",
            subcategory="toy_sort",
            labels={"family": "toy_sort", "item": "reward per epoch, delta x loss mode"},
        ),
        table_html=report(
            res("toy_sort", TOY_SORT_FILES["table_html"]),
            caption="../report/toy_sort.rst",
            category="9 Experiment families",
            subcategory="toy_sort",
            labels={"family": "toy_sort", "item": "final expected reward table"},
        ),
        table_csv=res("toy_sort", TOY_SORT_FILES["table_csv"]),
        curves_data=res("toy_sort", TOY_SORT_DATA["curves"]),
        finals_data=res("toy_sort", TOY_SORT_DATA["finals"]),
    params:
        seeds=CFG.workflow.toy_sort_seeds,
        epochs=f"--epochs {CFG.workflow.toy_sort_epochs}" if CFG.workflow.toy_sort_epochs else "",
        out=lambda w, output: os.path.dirname(output.table_csv),
    threads: 1
    log:
        "logs/run_toy_sort/run_toy_sort.log",
    benchmark:
        "benchmarks/run_toy_sort/run_toy_sort.tsv"
    shell:
        "OMP_NUM_THREADS=1 python -m rlpipe.watch {log} run_toy_sort -- sh -c 'rlpipe toy-sort --seeds "
        "{params.seeds} {params.epochs} --curves {output.curves_data} --finals {output.finals_data} && "
        "rlpipe toy-sort-report --dir {params.out}'"
