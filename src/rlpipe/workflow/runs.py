"""Every training run of the workflow: a track's variants and each family's replicates, with their
resolved train settings, pipelines, seeds and job threads.

Each is resolved once, when first asked for, and kept: a rule's input, param and resource functions
ask for the same run several times per job, and a cluster job parses the workflow again for one job
(so it must not resolve every family's pipeline to name its own).

Identical runs (same track, settings, seed and job threads) train once (``owner``):
- a replicate identical to one of its track's own runs reads that run (the systems family's first seed
  is results/runs/<variant> when its settings equal the table's: no `base`, and a variant that does
  not override the seed);
- families share identical replicates: the reference settings of several math families are the same
  run (lr_sweep's lr1e-4 is length_norm's masked_mean, std_norm's std, ...), so it trains once, under
  the first family in config order that has it, and every family's report reads it under its own
  variant name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cached_property

from snakemake.exceptions import WorkflowError

from rlpipe.config import (
    PipelineConfig,
    Track,
    TrainConfig,
    active_families,
    family_pipeline,
    resolve_variant,
    to_dict,
)
from rlpipe.workflow.params import canonical

#: the owner of a replicate that is one of a track's own runs (results/<track subdir>runs/<variant>)
TRACK_RUN = "(track run)"


def run_key(track: str, train: TrainConfig, seed, threads: int) -> tuple:
    """What a run computes and how it is timed: its track (base model and data), resolved train
    settings and job threads (a run alone on both cores is not a run beside another)."""
    return track, canonical(dict(to_dict(train), seed=int(seed))), threads


class FamilyConfigs(Mapping):
    """family -> its pipeline config (rlpipe.config.family_pipeline), derived on first access."""

    def __init__(self, runs: Runs):
        self._runs = runs

    def __getitem__(self, family: str) -> PipelineConfig:
        return self._runs.family_cfg(family)

    def __iter__(self) -> Iterator[str]:
        return iter(self._runs.families)

    def __len__(self) -> int:
        return len(self._runs.families)


class Runs:
    """The runs of ``cfg`` on the active ``tracks`` (name -> Track). ``check_runs=False`` (a cluster
    job's parse): a family's pipeline is derived without resolving each of its variants again."""

    def __init__(self, cfg: PipelineConfig, tracks: dict[str, Track], *, check_runs: bool = True):
        self.cfg, self.tracks, self.check_runs = cfg, tracks, check_runs
        self.by_dir = {t.subdir: t for t in tracks.values()}
        self.families = active_families(cfg)  # those whose track is on
        self.family_cfgs = FamilyConfigs(self)
        self._family_cfg: dict[str, PipelineConfig] = {}
        self._trains: dict[tuple, TrainConfig] = {}

    # ------------------------------------------------------------------ settings
    def _resolved(self, key: tuple, pipeline: PipelineConfig, variant: str) -> TrainConfig:
        if key not in self._trains:
            self._trains[key] = resolve_variant(pipeline, variant)
        return self._trains[key]

    def track_train(self, track: str, variant: str) -> TrainConfig:
        """A track variant's resolved train settings."""
        return self._resolved(("track", track, variant), self.tracks[track].pipeline, variant)

    def track_variant(self, tdir: str, variant: str) -> tuple[Track, TrainConfig]:
        """(Track, resolved train settings) of a train_variant job."""
        t = self.by_dir[tdir]
        if variant not in t.pipeline.variants:
            known = ", ".join(t.pipeline.variants) or "none"
            raise WorkflowError(f"track {t.name} has no variant '{variant}' ({known})")
        return t, self.track_train(t.name, variant)

    def family_cfg(self, family: str) -> PipelineConfig:
        """The family's own pipeline config: its track's, with the family's base and variants."""
        if family not in self._family_cfg:
            if family not in self.families:
                raise KeyError(family)
            self._family_cfg[family] = family_pipeline(self.cfg, family, check_runs=self.check_runs)
        return self._family_cfg[family]

    def family_train(self, family: str, variant: str) -> TrainConfig:
        """A family variant's resolved train settings (the seed is the replicate's)."""
        return self._resolved(("family", family, variant), self.family_cfg(family), variant)

    def family_variants(self, family: str) -> list[str]:
        """The family's variant names, without deriving its pipeline: a systems family's are its
        track's variants table (as rlpipe.config.family_pipeline takes them)."""
        fam = self.cfg.families[family]
        if fam.is_systems:
            return list(self.tracks[fam.base_track].pipeline.variants)
        return [k for k, v in fam.variants.items() if v is not None]

    def family_seeds(self, family: str) -> list[int]:
        """Replicate seeds: the family's resolved train.seed, then the next ``replicates - 1``."""
        first = self.family_cfg(family).train.seed
        return [first + i for i in range(self.cfg.families[family].replicates)]

    def family_runs(self, family: str) -> list[tuple[str, int]]:
        """(variant, seed) of every replicate of the family."""
        return [(v, s) for v in self.family_cfg(family).variants for s in self.family_seeds(family)]

    def family_track(self, family: str) -> Track:
        """The Track a family starts from."""
        return self.tracks[self.cfg.families[family].base_track]

    # ------------------------------------------------------------------ threads
    def track_threads(self, t: Track) -> int:
        """A timed track's runs run alone (threads_per_variant); the others share the cores."""
        w = self.cfg.workflow
        return w.threads_per_variant if t.timed else w.family_threads

    def family_job_threads(self, family: str) -> int:
        """A systems-family replicate compares speed: it runs alone, like a timed track's variants
        (workflow.threads_per_variant); every other replicate takes workflow.family_threads."""
        w = self.cfg.workflow
        return w.threads_per_variant if self.cfg.families[family].is_systems else w.family_threads

    # ------------------------------------------------------------------ owners
    @cached_property
    def owners(self) -> dict[tuple, tuple]:
        """(family, variant, seed) -> the run that trains it: (TRACK_RUN, track, variant) or a
        (family, variant, seed); see the module docstring."""
        first = {run_key(name, tr, tr.seed, self.track_threads(t)): (TRACK_RUN, name, v)
                 for name, t in self.tracks.items() for v in t.pipeline.variants
                 for tr in [self.track_train(name, v)]}
        owners = {}
        for f in self.families:
            threads = self.family_job_threads(f)
            for v, s in self.family_runs(f):
                key = run_key(self.family_track(f).name, self.family_train(f, v), s, threads)
                owners[(f, v, s)] = first.setdefault(key, (f, v, s))
        return owners

    def trains_itself(self, family: str, variant: str, seed: int) -> bool:
        """Whether the replicate is trained under its own family (no identical run before it)."""
        return self.owners[(family, variant, seed)] == (family, variant, seed)
