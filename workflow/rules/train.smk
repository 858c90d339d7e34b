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
# Resume: after a crash or a hard kill the next invocation (with --rerun-incomplete) resumes from
# checkpoints/last.pt - but only if that checkpoint was written by a run with the same settings
# (FINGERPRINT) that did not finish (no FINISHED marker). Anything else starts afresh, so a
# forced rerun or a changed variant never continues a stale run. The checkpoint directory is not a
# declared output, so Snakemake leaves it alone when it deletes the outputs of a failed job.


rule train_variant:
    input:
        unpack(train_inputs),
    output:
        **run_outputs("{variant}"),
    params:
        train=lambda w: variant_train(w.variant),
        fingerprint=lambda w: variant_fingerprint(w.variant),
        run_dir=lambda w: res("runs", w.variant),
        dataset=res("data", "keywords"),
    resources:
        gpu=lambda w: variant_gpus(CFG, w.variant),
    threads: CFG.workflow.threads_per_variant
    log:
        "logs/train_variant/{variant}.log",
    benchmark:
        "benchmarks/train_variant/{variant}.tsv"
    shell:
        """
        ckpt="{params.run_dir}/checkpoints"
        resume=""
        if [ -f "$ckpt/last.pt" ] && [ ! -f "$ckpt/FINISHED" ] \
           && [ "$(cat "$ckpt/FINGERPRINT" 2>/dev/null || true)" = "{params.fingerprint}" ]; then
            resume="--resume"
        else
            rm -rf "$ckpt"
        fi
        mkdir -p "$ckpt" && echo "{params.fingerprint}" > "$ckpt/FINGERPRINT"
        echo "rlpipe train {wildcards.variant}: threads={threads} gpus={resources.gpu} $resume" > {log}
        rlpipe train --config {input.config} --variant {wildcards.variant} --base {input.base} \
            --dataset {params.dataset} --out {params.run_dir} --threads {threads} $resume >> {log} 2>&1
        touch "$ckpt/FINISHED"
        """
