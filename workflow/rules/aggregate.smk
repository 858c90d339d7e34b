# Every run's outputs -> results/summary/: combined parquet files (with a `variant` column), the
# per-variant summary table (CSV + HTML) and the discussion whose numbers come from the data.


# lint: conda (no environment on purpose, see common.smk)
rule aggregate_metrics:
    input:
        runs=expand(res("runs", "{variant}", "run_info.json"), variant=VARIANTS),
        metrics=expand(res("runs", "{variant}", "metrics.parquet"), variant=VARIANTS),
        bench=[res("bench", f"{b}.json") for b in BENCH_NAMES],  # trl only where installed (bench.smk)
        code=code_inputs("aggregate"),  # the report's code (common.smk)
    output:
        **{k: res("summary", f) for k, f in SUMMARY_FILES.items()},
        table_html=report(
            res("summary", "summary.html"),
            caption="../report/summary.rst",
            category="1 Results",
            labels={"item": "summary table"},
        ),
        discussion_html=report(
            res("summary", "discussion.html"),
            caption="../report/discussion.rst",
            category="1 Results",
            labels={"item": "discussion (computed from the data)"},
        ),
    params:
        variants=VARIANTS,
        reference=table_reference(CFG),  # the systems family's baseline too
        runs=lambda w, input: os.path.dirname(os.path.dirname(input.runs[0])),
        out=lambda w, output: os.path.dirname(output.table_html),
    resources:
        mem_mb=ANALYSIS_MEM_MB,
    group:
        ANALYSIS_GROUP
    log:
        "logs/aggregate_metrics/aggregate_metrics.log",
    shell:
        "python -m rlpipe.watch {log} aggregate_metrics -- "
        "rlpipe aggregate --runs {params.runs} --out {params.out} --variants {params.variants} "
        "--reference {params.reference} --bench {input.bench}"


# results/RESULTS.md: the answers to the seed questions (the deliverables manifest as a table of
# contents, each answer computed), then the headline numbers of this run with the date, machine, CPU
# capability and package versions they came from (rlpipe.analysis.results_page); the docs' Results
# page includes it. answers.html is the same answers as the report's first page.
# lint: conda (no environment on purpose, see common.smk)
rule write_results_page:
    input:
        data=results_page_inputs(),  # the page's tables and what the answers read (common.smk)
        # Not an input: the last complete run's duration (run_timing.json), which setup.smk's onsuccess
        # writes after every job, so as an input it would mark this page out of date after each complete
        # run. The page states the record that exists when it is written, with its finishing time.
        code=code_inputs("results-page"),
    output:
        page=res("RESULTS.md"),
        answers=report(
            res("answers.html"),
            caption="../report/answers.rst",
            category="0 Answers to the seed questions",
            labels={"item": "every seed question and its computed answer"},
        ),
    params:
        results=lambda w, output: os.path.dirname(output.page),
    resources:
        mem_mb=ANALYSIS_MEM_MB,
    group:
        ANALYSIS_GROUP
    log:
        "logs/write_results_page/write_results_page.log",
    shell:
        "python -m rlpipe.watch {log} write_results_page -- "
        "rlpipe results-page --results {params.results} --out {output.page} --answers-html {output.answers} "
