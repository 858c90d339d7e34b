# The built-in tracks' data: the keyword track's corpus, keyword-inclusion dataset, imported base
# model and zero-shot check, and the math track's generated arithmetic task (CLI contract in
# CONTRIBUTING.md). Each rule's params are the config sections it reads. The tokenizer, pretraining
# and training rules are every track's (tracks.smk).


# lint: conda (no environment on purpose, see common.smk)
# lint: CONFIG_FILE (a global, not a param: see common.smk)
rule build_corpus:
    priority: 40  # after the test gate (45), before the toy grid (1 thread each beside the math chain)
    input:
        source=optional_file(CFG.data.corpus_path),
    output:
        res("data", "corpus.txt"),
    params:
        cfg=section_params("data"),
    group:
        PREPARE_GROUP
    log:
        "logs/build_corpus/build_corpus.log",
    shell:
        "python -m rlpipe.watch {log} build_corpus -- "
        "rlpipe build-corpus --config {CONFIG_FILE} --out {output}"


if CFG.model.base_checkpoint is not None:


    # lint: conda (no environment on purpose, see common.smk)
    # lint: CONFIG_FILE (a global, not a param: see common.smk)
    rule import_base:
        input:
            checkpoint=CFG.model.base_checkpoint,
            tokenizer=tokenizer_inputs(),
        output:
            res("base", "model.pt"),
        params:
            cfg=section_params("model", "tokenizer"),
        group:
            PREPARE_GROUP
        log:
            "logs/import_base/import_base.log",
        shell:
            "rlpipe import-base --config {CONFIG_FILE} --out {output} > {log} 2>&1"


# lint: conda (no environment on purpose, see common.smk)
# lint: CONFIG_FILE (a global, not a param: see common.smk)
rule evaluate_base:
    # The base model's zero-shot keyword reward on 256 validation prompts; the log warns when it is
    # outside the band where GRPO has something to reinforce and room to improve.
    input:
        base=res("base", "model.pt"),
        val=res("data", "keywords", "val.jsonl"),
    output:
        res("base", "zero_shot.json"),
    params:
        cfg=lambda w: canonical({"train": eval_base_settings(CFG)}),  # the train keys eval-base reads, no others
        dataset=lambda w, input: os.path.dirname(input.val),
    threads: CFG.pretrain.threads
    log:
        "logs/evaluate_base/evaluate_base.log",
    shell:
        "python -m rlpipe.watch {log} evaluate_base -- "
        "rlpipe eval-base --config {CONFIG_FILE} --checkpoint {input.base} --dataset {params.dataset} "
        "--n 256 --out {output}"


# lint: conda (no environment on purpose, see common.smk)
# lint: CONFIG_FILE (a global, not a param: see common.smk)
rule build_keyword_dataset:
    input:
        keywords=optional_file(CFG.data.keywords_path),
    output:
        train=res("data", "keywords", "train.jsonl"),
        val=res("data", "keywords", "val.jsonl"),
        split=res("data", "keywords", "split.json"),
    params:
        cfg=section_params("data"),
        out=lambda w, output: os.path.dirname(output.train),
    log:
        "logs/build_keyword_dataset/build_keyword_dataset.log",
    shell:
        "python -m rlpipe.watch {log} build_keyword_dataset -- "
        "rlpipe build-dataset --config {CONFIG_FILE} --out {params.out}"


if MATH_TRACK in TRACKS and TRACKS[MATH_TRACK].dataset_dir is None:


    # lint: conda (no environment on purpose, see common.smk)
    # lint: CONFIG_FILE (a global, not a param: see common.smk)
    rule build_math_data:
        priority: 50  # the pretraining chains first: they are the longest paths to the runs
        output:
            train=track_res(MATH_TRACK, "data", "train.jsonl"),
            val=track_res(MATH_TRACK, "data", "val.jsonl"),
            corpus=track_res(MATH_TRACK, "data", CORPUS_FILE),
        params:
            cfg=canonical(ident(CFG.math.arithmetic, "math.arithmetic")),
            out=lambda w, output: os.path.dirname(output.train),
        group:
            PREPARE_GROUP
        log:
            "logs/build_math_data/build_math_data.log",
        shell:
            "python -m rlpipe.watch {log} build_math_data -- "
            "rlpipe build-math-data --config {CONFIG_FILE} --out {params.out}"
