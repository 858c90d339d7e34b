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
            'OMP_NUM_THREADS={threads} python -m pytest {params.args} -p no:cacheprovider '
            '--junitxml="$out" > "$log" 2>&1'
