# Every run's outputs -> results/summary/: combined parquet files (with a `variant` column), the
# per-variant summary table (CSV + HTML) and the discussion whose numbers come from the data.


# lint: conda (no environment on purpose, see common.smk)
rule aggregate_metrics:
    input:
        runs=expand(res("runs", "{variant}", "run_info.json"), variant=VARIANTS),
        metrics=expand(res("runs", "{variant}", "metrics.parquet"), variant=VARIANTS),
        bench=[res("bench", f"{b}.json") for b in ("weight_sync", "sampler", "update", "trl")],
        code=[module_file(f"rlpipe.analysis.{m}") for m in ("aggregate", "report_text", "bench_text")],
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
    log:
        "logs/aggregate_metrics/aggregate_metrics.log",
    shell:
        "rlpipe aggregate --runs {params.runs} --out {params.out} --variants {params.variants} "
        "--reference {params.reference} --bench {input.bench} > {log} 2>&1"


# results/RESULTS.md: the headline numbers of this run with the date, machine, CPU capability and
# package versions they came from (rlpipe.analysis.results_page); the docs' Results page includes it.
# lint: conda (no environment on purpose, see common.smk)
rule write_results_page:
    input:
        data=results_page_inputs(),
        code=module_file("rlpipe.analysis.results_page"),
    output:
        res("RESULTS.md"),
    params:
        results=lambda w, output: os.path.dirname(output[0]),
    log:
        "logs/write_results_page/write_results_page.log",
    shell:
        "rlpipe results-page --results {params.results} --out {output} > {log} 2>&1"
