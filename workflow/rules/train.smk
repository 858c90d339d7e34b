# One GRPO training job per variant (`rlpipe train`, the Ray trainer).
#
# Resources: `gpu` is what rlpipe.config.variant_gpus says (0 on a CPU config; 1 colocated / 2
# disaggregated on config/gpu.yaml), so `--resources gpu=N` bounds concurrent GPU jobs and the SLURM
# profile turns it into `--gpus`. `threads` is workflow.threads_per_variant, handed to the trainer
# (`--threads`: torch threads per actor and the local Ray instance's CPUs follow from it).
#
# Timing-sensitive: wall-clock comparisons between variants are only valid if runs do not share
# cores. On the CPU default threads_per_variant equals the machine's cores, so Snakemake (which never
# runs jobs whose threads exceed --cores) runs one training job at a time.
#
# Resume: a forced rerun (--forcerun train_variant, -f, -F) passes `--resume never` and starts afresh;
# otherwise `rlpipe train --resume auto` decides (rlpipe.trainer.resume): after a crash or a hard
# kill the next invocation (with --rerun-incomplete) continues from checkpoints/last.pt, but only if
# that checkpoint was written by an unfinished run with the same settings. The mode is a resource,
# not a param, so forcing one invocation does not make the next one rerun the variant.
# The checkpoint directory is not a declared output, so Snakemake leaves it alone when it deletes
# the outputs of a failed job.


# lint: conda (no environment on purpose, see common.smk)
# lint: CONFIG_FILE (a global, not a param: see common.smk)
rule train_variant:
    input:
        unpack(train_inputs),
    output:
        **run_outputs("{variant}"),
    params:
        train=lambda w: variant_train(w.variant),  # a change in the variant's settings reruns it
        run_dir=lambda w, output: os.path.dirname(output.metrics),
        dataset=lambda w, input: f"--dataset {os.path.dirname(input.dataset)}" if "dataset" in input.keys() else "",
    resources:
        gpu=lambda w: variant_gpus(CFG, w.variant),
        resume=resume_mode,  # "never" when this invocation forces the job, else "auto"
    threads: CFG.workflow.threads_per_variant
    log:
        "logs/train_variant/{variant}.log",
    benchmark:
        "benchmarks/train_variant/{variant}.tsv"
    shell:
        "rlpipe train --config {CONFIG_FILE} --variant {wildcards.variant} --base {input.base} "
        "{params.dataset} --out {params.run_dir} --threads {threads} --resume {resources.resume} > {log} 2>&1"
