# Micro-benchmarks (timing-sensitive: they take the same threads as a training job so they never
# share cores with one). Their JSON feeds the weight-sync figure next to the runs' own sync times.


rule bench_weight_sync:
    input:
        tests=tests_done(),
    output:
        res("bench", "weight_sync.json"),
    threads: CFG.workflow.threads_per_variant
    resources:
        gpu=CFG.workflow.gpus_per_disaggregated,
    log:
        "logs/bench_weight_sync/bench_weight_sync.log",
    benchmark:
        "benchmarks/bench_weight_sync/bench_weight_sync.tsv"
    shell:
        "rlpipe bench weight-sync --out {output} > {log} 2>&1"


rule bench_sampler:
    input:
        tests=tests_done(),
    output:
        res("bench", "sampler.json"),
    threads: CFG.workflow.threads_per_variant
    resources:
        gpu=CFG.workflow.gpus_per_colocated,
    log:
        "logs/bench_sampler/bench_sampler.log",
    benchmark:
        "benchmarks/bench_sampler/bench_sampler.tsv"
    shell:
        "rlpipe bench sampler --out {output} > {log} 2>&1"
