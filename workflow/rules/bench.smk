# Micro-benchmarks. Timing-sensitive: they take the same threads as a training job, so on the CPU
# default they never share cores with one. Their JSON feeds the report (weight-sync figure next to
# the runs' own sync times; the sampler numbers in the discussion's benchmark section).


# lint: conda (no environment on purpose, see common.smk)
rule bench_weight_sync:
    input:
        tests=tests_done(),
        base=res("base", "model.pt"),  # the payload is the pipeline's own base model
    output:
        res("bench", "weight_sync.json"),
    params:
        repeats=CFG.workflow.bench_repeats,
        sizes=",".join(f"{mb:g}" for mb in CFG.workflow.bench_sizes_mb),
    threads: CFG.workflow.threads_per_variant
    resources:
        gpu=CFG.workflow.gpus_per_disaggregated,
    log:
        "logs/bench_weight_sync/bench_weight_sync.log",
    benchmark:
        "benchmarks/bench_weight_sync/bench_weight_sync.tsv"
    shell:
        "rlpipe bench weight-sync --checkpoint {input.base} --repeats {params.repeats} --sizes-mb {params.sizes} "
        "--out {output} > {log} 2>&1"


# lint: conda (no environment on purpose, see common.smk)
rule bench_sampler:
    input:
        tests=tests_done(),
    output:
        res("bench", "sampler.json"),
    params:
        preset=CFG.model.preset,
        repeats=CFG.workflow.bench_repeats,
        batch=CFG.train.rollout_batch_size,
        new_tokens=CFG.train.sampling_max_tokens,
        device=bench_device(),
    threads: CFG.workflow.threads_per_variant
    resources:
        gpu=CFG.workflow.gpus_per_colocated,
    log:
        "logs/bench_sampler/bench_sampler.log",
    benchmark:
        "benchmarks/bench_sampler/bench_sampler.tsv"
    shell:
        "rlpipe bench sampler --preset {params.preset} --batch {params.batch} --new-tokens {params.new_tokens} "
        "--repeats {params.repeats} --device {params.device} --threads {threads} --out {output} > {log} 2>&1"


# rlpipe's colocated on-policy GRPO side by side with TRL's GRPOTrainer (issue 13 item 4): the same
# exported model, keyword task, prompts and settings (rlpipe.bench.trl says which cannot be equal).
# Needs the optional `bench` extra (trl); without it the command writes {"skipped": true, ...} at
# once, so the default pipeline does not pay for it. Not in all_targets: request it by path.
# lint: conda (no environment on purpose, see common.smk)
# lint: CONFIG_FILE (a global, not a param: see common.smk)
rule bench_trl:
    input:
        tests=tests_done(),
        base=res("base", "model.pt"),
        dataset=res("data", "keywords", "train.jsonl"),
    output:
        report(
            res("bench", "trl.json"),
            caption="../report/trl.rst",
            category="4 Throughput and GPU-hours",
            labels={"figure": "rlpipe vs TRL GRPOTrainer (JSON)"},
        ),
    params:
        dataset=lambda w, input: os.path.dirname(input.dataset),
        # the onpolicy variant's batch (prompts x G), for at most 16 steps (~4 min on 2 cores with trl)
        steps=min(16, CFG.train.n_grpo_steps),
        prompts=CFG.train.rollout_batch_size // CFG.train.group_size,
    threads: CFG.workflow.threads_per_variant
    log:
        "logs/bench_trl/bench_trl.log",
    benchmark:
        "benchmarks/bench_trl/bench_trl.tsv"
    shell:
        "rlpipe bench trl --config {CONFIG_FILE} --checkpoint {input.base} --dataset {params.dataset} "
        "--steps {params.steps} --prompts-per-step {params.prompts} --threads {threads} --out {output} > {log} 2>&1"
