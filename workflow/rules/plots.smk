# One rule per figure (plot_<kind>), generated from rlpipe.contract.FIGURES (imported by
# common.smk). Each takes the plotting code as inputs (code_inputs: `rlpipe plot`'s module and the
# analysis modules it loads), so editing it reruns the figures and nothing upstream. Captions:
# workflow/report/<kind>.rst.

for _kind, _fig in FIGURES.items():

    # lint: conda (no environment on purpose, see common.smk)
    rule:
        name:
            f"plot_{_kind}"
        input:
            summary=[res("summary", f) for f in SUMMARY_FILES.values()],
            code=code_inputs("plot"),
        output:
            report(
                figure_path(_kind),
                caption=f"../report/{_kind}.rst",
                category=_fig.category,
                labels={"figure": _fig.title},
            ),
        params:
            kind=_kind,
            summary=lambda w, input: os.path.dirname(input.summary[0]),
        resources:
            mem_mb=ANALYSIS_MEM_MB,
        group:
            ANALYSIS_GROUP
        log:
            f"logs/plot_{_kind}/plot_{_kind}.log",
        shell:
            "rlpipe plot {params.kind} --summary {params.summary} --out {output} > {log} 2>&1"
