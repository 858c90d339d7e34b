# The resolved config every command reads, and the unit tests that gate all training.


# lint: conda (no environment on purpose, see common.smk)
rule write_config:
    output:
        CONFIG_FILE,
    params:
        # the whole resolved config: rewritten whenever any value changes (consumers take it as
        # ancient() and track their own sections, see common.smk)
        text=CONFIG_TEXT,
    log:
        "logs/write_config/write_config.log",
    run:
        from rlpipe import io

        io.write_text(output[0], params.text)
        io.write_text(log[0], f"wrote {output[0]}\n")


if CFG.workflow.run_tests:


    # lint: conda (no environment on purpose, see common.smk)
    rule run_unit_tests:
        output:
            res("tests", "junit.xml"),
        params:
            args=CFG.workflow.test_args,
            repo=str(REPO),
        log:
            "logs/run_unit_tests/pytest.log",
        threads: 2
        shell:
            # pytest runs from the repository (its pyproject holds the markers); outputs and the
            # log are made absolute first because the workdir may be elsewhere (--directory).
            'out="$PWD/{output}"; log="$PWD/{log}"; cd {params.repo} && '
            'OMP_NUM_THREADS={threads} python -m pytest {params.args} -p no:cacheprovider '
            '--junitxml="$out" > "$log" 2>&1'
