"""The Snakemake workflow's logic (``Snakefile`` and ``workflow/rules/*.smk``), kept out of the rule
files so that it is tested without Snakemake: the ``.smk`` files declare rules and call these, in the
snakemake-workflows style.

- ``loading``: the config as the workflow reads it (overlay nulls, targets taken for config files,
  parsing and the path checks before any job, list-replacement warnings);
- ``resolved``: the content-addressed resolved config files every command reads;
- ``track_checks`` / ``task_checks``: a track's given model, dataset, task and prompts, checked at
  parse time (``task_checks`` imports the tasks and torch: the workflow loads it only when a track
  needs it);
- ``code_inputs``: a report's code as inputs of its rule, by following import statements;
- ``params``: canonical JSON params, identity sections, forced jobs, wildcard constraints;
- ``layout``: the one path scheme of every track's results;
- ``runs``: each run's resolved settings, each family's pipeline, seeds and run owners, resolved
  once and only when asked (each cluster job parses the workflow again);
- ``jobs``: the input, param and resource functions of the training, evaluation and report rules;
- ``gpus``: the GPUs each job declares (exactly what its command uses) and the device it runs on;
- ``targets``: what the default target and the results page need.

Departure from a single ``common.smk``: nothing here reads Snakemake's globals; the workflow object
and the parsed config are passed in.
"""
