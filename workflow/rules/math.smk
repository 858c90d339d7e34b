# The MATH track (seeds 001/004): data -> tokenizer -> base model -> zero-shot eval -> GRPO variants
# -> final-policy evals -> report. Every command reads MATH_CONFIG_FILE, the track's own resolved
# pipeline config (common.smk); params are the sections each stage reads, as in the keyword track.
# With math.base_model_dir (a local HuggingFace model) the tokenizer and pretraining stages drop out;
# with math.dataset_dir (MATH-format JSONL) the runs and evals read it instead of the generated task.


# lint: conda (no environment on purpose, see common.smk)
# lint: CONFIG_FILE (a global, not a param: see common.smk)
rule build_math_data:
    priority: 50  # the math chain first: its pretraining is the longest path to the families
    output:
        train=math_res("data", "train.jsonl"),
        val=math_res("data", "val.jsonl"),
        corpus=math_res("data", "corpus.txt"),
    params:
        cfg=canonical(to_dict(CFG.math.arithmetic)),
        out=lambda w, output: os.path.dirname(output.train),
    log:
        "logs/build_math_data/build_math_data.log",
    shell:
        "rlpipe build-math-data --config {CONFIG_FILE} --out {params.out} > {log} 2>&1"


if MATH_ON and CFG.math.base_model_dir is None and MATH_CFG.tokenizer.path is None:


    # lint: conda (no environment on purpose, see common.smk)
    # lint: CONFIG_FILE (a global, not a param: see common.smk)
    rule train_math_tokenizer:
        priority: 50  # the math chain first: its pretraining is the longest path to the families
        input:
            corpus=math_res("data", "corpus.txt"),
        output:
            math_res("tokenizer", "tokenizer.json"),
        params:
            cfg=lambda w: math_section_params("tokenizer"),
        log:
            "logs/train_math_tokenizer/train_math_tokenizer.log",
        shell:
            "rlpipe train-tokenizer --config {MATH_CONFIG_FILE} --corpus {input.corpus} --out {output} > {log} 2>&1"


if MATH_ON and CFG.math.base_model_dir is None:


    # lint: conda (no environment on purpose, see common.smk)
    # lint: CONFIG_FILE (a global, not a param: see common.smk)
    rule pretrain_math_base:
        priority: 50  # the math chain first: its pretraining is the longest path to the families
        input:
            corpus=math_res("data", "corpus.txt"),
            tokenizer=math_tokenizer_inputs(),
        output:
            math_res("base", "model.pt"),
        params:
            cfg=lambda w: math_section_params("model", "pretrain", "tokenizer"),
            tokenizer=lambda w, input: input.tokenizer[0] if input.tokenizer else MATH_CFG.tokenizer.path,
        threads: MATH_CFG.pretrain.threads if MATH_ON else 1
        resources:
            gpu=1 if MATH_ON and MATH_CFG.pretrain.device.startswith("cuda") else 0,
        log:
            "logs/pretrain_math_base/pretrain_math_base.log",
        benchmark:
            "benchmarks/pretrain_math_base/pretrain_math_base.tsv"
        shell:
            "rlpipe pretrain --config {MATH_CONFIG_FILE} --corpus {input.corpus} "
            "--tokenizer {params.tokenizer} --out {output} > {log} 2>&1"


# lint: conda (no environment on purpose, see common.smk)
# lint: CONFIG_FILE (a global, not a param: see common.smk)
rule evaluate_math:
    # Zero-shot evaluation of the base model (seed 001 Problem 1) and of each variant's final policy:
    # per-example rewards and the three format/answer categories.
    input:
        unpack(math_eval_inputs),
    output:
        **math_eval_outputs("{math_model}"),
    params:
        cfg=lambda w: canonical({"math": to_dict(CFG.math), "train": to_dict(MATH_CFG.train)}),
        checkpoint=math_eval_checkpoint,
        dataset=lambda w: math_dataset_dir(),
        out=lambda w, output: os.path.dirname(output.summary),
    threads: CFG.workflow.family_threads  # compares learning, not speed
    resources:
        gpu=lambda w: 1 if MATH_ON and MATH_CFG.workflow.gpus_per_colocated > 0 else 0,
    log:
        "logs/evaluate_math/{math_model}.log",
    benchmark:
        "benchmarks/evaluate_math/{math_model}.tsv"
    shell:
        "rlpipe eval --config {MATH_CONFIG_FILE} --checkpoint {params.checkpoint} --dataset {params.dataset} "
        "--threads {threads} --out {params.out} > {log} 2>&1"


# lint: conda (no environment on purpose, see common.smk)
# lint: CONFIG_FILE (a global, not a param: see common.smk)
rule train_math_variant:
    # One GRPO run of the MATH track (`rlpipe train`, the same Ray trainer as train_variant).
    input:
        base=math_base_inputs(),
        dataset=math_dataset_inputs(),
        tests=tests_done(),
    output:
        **math_run_outputs("{math_variant}"),
    params:
        train=lambda w: math_variant_train(w.math_variant),
        base=lambda w: math_base(),  # the HF directory or our checkpoint (inputs: its config.json / itself)
        dataset=lambda w: math_dataset_dir(),
        run_dir=lambda w, output: os.path.dirname(output.metrics),
    resources:
        gpu=lambda w: variant_gpus(MATH_CFG, w.math_variant),
        resume=math_resume_mode,
    threads: CFG.workflow.family_threads  # compares learning, not speed
    log:
        "logs/train_math_variant/{math_variant}.log",
    benchmark:
        "benchmarks/train_math_variant/{math_variant}.tsv"
    shell:
        "rlpipe train --config {MATH_CONFIG_FILE} --variant {wildcards.math_variant} --base {params.base} "
        "--dataset {params.dataset} --out {params.run_dir} --threads {threads} --resume {resources.resume} "
        "> {log} 2>&1"


# lint: conda (no environment on purpose, see common.smk)
rule report_math:
    input:
        evals=expand(math_res("eval", "{m}", EVAL_FILES["summary"]), m=["base", *MATH_VARIANTS]),
        runs=expand(math_res("runs", "{v}", RUN_FILES["metrics"]), v=MATH_VARIANTS),
        code=module_file("rlpipe.analysis.math_report"),
    output:
        eval_html=report(
            math_res("report", MATH_REPORT_FILES["eval_html"]),
            caption="../report/math_eval.rst",
            category="8 MATH track",
            labels={"item": "zero-shot and final-policy evaluation"},
        ),
        learning=report(
            math_res("report", MATH_REPORT_FILES["learning_png"]),
            caption="../report/math_learning.rst",
            category="8 MATH track",
            labels={"item": "format and answer reward vs step"},
        ),
        numbers=math_res("report", MATH_REPORT_FILES["math_json"]),
    params:
        evals=lambda w, input: [os.path.dirname(p) for p in input.evals],
        labels=["base", *MATH_VARIANTS],
        runs=lambda w, input: [os.path.dirname(p) for p in input.runs],
        run_labels=MATH_VARIANTS,
        out=lambda w, output: os.path.dirname(output.numbers),
    log:
        "logs/report_math/report_math.log",
    shell:
        "rlpipe math-report --evals {params.evals} --labels {params.labels} --runs {params.runs} "
        "--run-labels {params.run_labels} --out {params.out} > {log} 2>&1"
