# Micro-benchmarks. Timing-sensitive: they take the same threads as a training job, so on the CPU
# default they never share cores with one. Their JSON feeds the report (weight-sync figure next to
# the runs' own sync times; the sampler numbers in the discussion's benchmark section).

# TRL is an optional extra, not in the lock: the default pipeline runs bench_trl (and the report
# shows it) only where TRL is installed; otherwise the report's benchmarks section says, in one
# sentence, how to add it (rlpipe.analysis.bench_text). A change of this list reruns aggregation.
TRL_INSTALLED = importlib.util.find_spec("trl") is not None
BENCH_NAMES = ("weight_sync", "sampler", "update", *(("trl",) if TRL_INSTALLED else ()))


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
        placements=weight_sync_placements(),  # those its GPUs allow: cpu; one shared GPU; two GPUs
    priority: 10  # long, and needing only the base: first, so a cluster runs it beside the runs, not after
    threads: CFG.workflow.threads_per_variant
    resources:
        gpu=CFG.workflow.gpus_per_disaggregated,
    log:
        "logs/bench_weight_sync/bench_weight_sync.log",
    benchmark:
        "benchmarks/bench_weight_sync/bench_weight_sync.tsv"
    shell:
        "python -m rlpipe.watch {log} bench_weight_sync -- "
        "rlpipe bench weight-sync --checkpoint {input.base} --repeats {params.repeats} --sizes-mb {params.sizes} "
        "--placements {params.placements} --out {output}"


# The sampler, update and TRL benches run where generation and the learner run (bench_device:
# train.device, 'auto' meaning CUDA only where the config declares GPUs) and declare that GPU.
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
        builds="" if CFG.workflow.bench_sampler_builds else " --no-compiled --no-aot",
    threads: CFG.workflow.threads_per_variant
    resources:
        gpu=bench_gpus(),
    log:
        "logs/bench_sampler/bench_sampler.log",
    benchmark:
        "benchmarks/bench_sampler/bench_sampler.tsv"
    shell:
        "python -m rlpipe.watch {log} bench_sampler -- "
        "rlpipe bench sampler --preset {params.preset} --batch {params.batch} --new-tokens {params.new_tokens} "
        "--repeats {params.repeats} --device {params.device} --threads {threads}{params.builds} --out {output}"


# The learner's update phase (forward + backward + AdamW, and the KL monitor's forward) against a
# matmul peak measured in the same process, on a learner actor's threads (train.threads).
# lint: conda (no environment on purpose, see common.smk)
rule bench_update:
    input:
        tests=tests_done(),
        base=res("base", "model.pt"),  # the pipeline's own model
    output:
        res("bench", "update.json"),
    params:
        batch=CFG.train.train_batch_size,
        group=CFG.train.group_size,
        grad_accum=CFG.train.gradient_accumulation_steps,
        response_tokens=CFG.train.sampling_max_tokens,
        repeats=CFG.workflow.bench_repeats,
        actor_threads=CFG.train.threads,
        device=bench_device(),
        dtype=CFG.train.dtype,
    threads: CFG.workflow.threads_per_variant
    resources:
        gpu=bench_gpus(),
    log:
        "logs/bench_update/bench_update.log",
    benchmark:
        "benchmarks/bench_update/bench_update.tsv"
    shell:
        "python -m rlpipe.watch {log} bench_update -- "
        "rlpipe bench update --checkpoint {input.base} --batch {params.batch} --group-size {params.group} "
        "--grad-accum {params.grad_accum} --response-tokens {params.response_tokens} --repeats {params.repeats} "
        "--threads {params.actor_threads} --device {params.device} --dtype {params.dtype} --out {output}"


# Scaling curves: short real training runs, colocated and disaggregated, one axis
# at a time (model width, rollout batch, response length; workflow.scaling_*), then the figure and
# the growth exponents, with weight-sync latency vs payload from bench_weight_sync.
# lint: conda (no environment on purpose, see common.smk)
# lint: CONFIG_FILE (a global, not a param: see common.smk)
rule bench_scaling:
    input:
        tests=tests_done(),
        base=res("base", "model.pt"),
        dataset=res("data", "keywords", "train.jsonl"),
    output:
        res("bench", SCALING_FILE),
    params:
        settings=lambda w: scaling_settings(),  # a function: a {field} in train.text.template is no wildcard
        dataset=lambda w, input: os.path.dirname(input.dataset),
    priority: 10  # long, and needing only the base: first, so a cluster runs it beside the runs, not after
    threads: CFG.workflow.threads_per_variant
    resources:
        gpu=scaling_gpus(),  # its points are training runs: what the pipeline's runs take (none: the CPU)
    log:
        "logs/bench_scaling/bench_scaling.log",
    benchmark:
        "benchmarks/bench_scaling/bench_scaling.tsv"
    shell:
        "python -m rlpipe.watch {log} bench_scaling -- "
        "rlpipe bench scaling --config {CONFIG_FILE} --base {input.base} --dataset {params.dataset} "
        "--threads {threads} --out {output}"


# lint: conda (no environment on purpose, see common.smk)
rule report_scaling:
    input:
        bench=res("bench", SCALING_FILE),
        weight_sync=res("bench", "weight_sync.json"),
        code=code_inputs("scaling-report"),
    output:
        figure=report(
            res("bench", SCALING_REPORT_DIR, SCALING_REPORT_FILES["figure"]),
            caption="../report/scaling.rst",
            category="4 Throughput and GPU-hours",
            labels={"figure": "scaling curves"},
        ),
        table=res("bench", SCALING_REPORT_DIR, SCALING_REPORT_FILES["table"]),
        discussion=report(
            res("bench", SCALING_REPORT_DIR, SCALING_REPORT_FILES["discussion"]),
            caption="../report/scaling_discussion.rst",
            category="4 Throughput and GPU-hours",
            labels={"figure": "scaling exponents"},
        ),
    params:
        out=lambda w, output: os.path.dirname(output.figure),
    resources:
        mem_mb=ANALYSIS_MEM_MB,
    group:
        ANALYSIS_GROUP
    log:
        "logs/report_scaling/report_scaling.log",
    shell:
        "python -m rlpipe.watch {log} report_scaling -- "
        "rlpipe scaling-report --bench {input.bench} --weight-sync {input.weight_sync} --out {params.out} "


# rlpipe's colocated on-policy GRPO side by side with TRL's GRPOTrainer: the same
# exported model, keyword task, prompts and settings (rlpipe.bench.trl says which cannot be equal).
# Needs the optional `bench` extra (trl): in all_targets, the aggregate's inputs and the report
# only where TRL is installed (BENCH_NAMES above). Requested by path without TRL, the command
# writes {"skipped": true, ...} at once, and that file is no report item.
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
        )
        if TRL_INSTALLED
        else res("bench", "trl.json"),
    params:
        dataset=lambda w, input: os.path.dirname(input.dataset),
        # the onpolicy variant's batch (prompts x G), for at most 16 steps
        steps=min(16, CFG.train.n_grpo_steps),
        prompts=CFG.train.rollout_batch_size // CFG.train.group_size,
        device="cuda" if bench_gpus() else "cpu",  # its --device takes cpu or cuda (the GPU it is given)
    threads: CFG.workflow.threads_per_variant
    resources:
        gpu=bench_gpus(),
    log:
        "logs/bench_trl/bench_trl.log",
    benchmark:
        "benchmarks/bench_trl/bench_trl.tsv"
    shell:
        "python -m rlpipe.watch {log} bench_trl -- "
        "rlpipe bench trl --config {CONFIG_FILE} --checkpoint {input.base} --dataset {params.dataset} "
        "--steps {params.steps} --prompts-per-step {params.prompts} --device {params.device} --threads {threads} "
        "--out {output}"
