"""One path scheme for every track: results/<subdir>{data,tokenizer,base,runs/<variant>,eval/<model>,
report}/ (subdir "" keeps the keyword track's results/runs/<variant>, the path the design card's users
rerun; the math track is results/math/; a user's track results/tracks/<name>/). Rules take the subdir
as the wildcard {tdir} and find the track with ``track_of``. A family's runs are
results/families/<family>/runs/<variant>/seed<seed>/. Every path and input of a track derives from its
``Track`` record (rlpipe.config.workflow_tracks) alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from rlpipe.config import CORPUS_FILE, KEYWORD_TRACK, MATH_TRACK, Track
from rlpipe.contract import EVAL_FILES, RUN_FILES, family_run_dir, figure_file


class Layout:
    """The results directory's paths, for the tracks this run has (``tracks``: name -> Track)."""

    def __init__(self, results: str, tracks: dict[str, Track]):
        self.results = results.rstrip("/")
        self.tracks = tracks
        self.by_dir = {t.subdir: t for t in tracks.values()}

    # ------------------------------------------------------------------ paths
    def res(self, *parts: str) -> str:
        """A path under the results directory."""
        return "/".join([self.results, *parts])

    def track_res(self, track: str, *parts: str) -> str:
        """A path under a track's directory."""
        return f"{self.results}/{self.tracks[track].subdir}" + "/".join(parts)

    def tdir_res(self, *parts: str) -> str:
        """An output pattern under the track directory wildcard {tdir}."""
        return f"{self.results}/{{tdir}}" + "/".join(parts)

    def track_of(self, wildcards) -> Track:
        return self.by_dir[wildcards.tdir]

    def tdirs(self, pick: Callable[[Track], bool]) -> str:
        """A {tdir} constraint: the subdirs of the tracks ``pick(track)`` selects ('(?!)': none)."""
        chosen = [re.escape(t.subdir) for t in self.tracks.values() if pick(t)]
        return f"(?:{'|'.join(chosen)})" if chosen else "(?!)"

    def figure_path(self, kind: str) -> str:
        return self.res("figures", figure_file(kind))

    def family_res(self, family: str, *parts: str) -> str:
        return self.res("families", family, *parts)

    # ------------------------------------------------------------------ a track's files
    def track_dataset_dir(self, t: Track) -> str:
        """Where the track's task reads its files: a given directory or the one its data rule builds."""
        return t.dataset_dir or self.track_res(t.name, t.data_subdir)

    def track_dataset_inputs(self, t: Track) -> list[str]:
        """The dataset as inputs: the built files (keyword, math), the directory a user's command
        builds, or whatever a given directory holds."""
        if t.dataset_dir:
            return sorted(str(p) for p in Path(t.dataset_dir).iterdir() if p.is_file())
        if t.dataset_command:
            return [self.track_dataset_dir(t)]
        return [self.track_res(t.name, t.data_subdir, f) for f in ("train.jsonl", "val.jsonl")]

    def track_corpus(self, t: Track) -> str:
        """The pretraining corpus of a track that pretrains its own base model."""
        if t.name == KEYWORD_TRACK:
            return self.res("data", CORPUS_FILE)
        if t.name == MATH_TRACK:
            return self.track_res(t.name, "data", CORPUS_FILE)
        return f"{self.track_dataset_dir(t)}/{CORPUS_FILE}"

    def track_corpus_inputs(self, t: Track) -> list[str]:
        """The corpus as an input (a user's command-built corpus: its data directory)."""
        return self.track_dataset_inputs(t) if t.dataset_command else [self.track_corpus(t)]

    def track_tokenizer_inputs(self, t: Track) -> list[str]:
        """The tokenizer file as an input, unless it is a spec such as 'tiktoken:gpt2'."""
        spec = t.pipeline.tokenizer.path
        if spec is None:
            return [self.track_res(t.name, "tokenizer", "tokenizer.json")]
        return [spec] if Path(spec).exists() else []

    def tokenizer_inputs(self) -> list[str]:
        """The keyword track's tokenizer (import_base)."""
        return self.track_tokenizer_inputs(self.tracks[KEYWORD_TRACK])

    def track_base(self, t: Track) -> str:
        """What `--base` gets: a given HF directory or checkpoint, or the track's base/model.pt."""
        return t.base_model or self.track_res(t.name, "base", "model.pt")

    def track_base_inputs(self, t: Track) -> list[str]:
        if t.base_model:
            hf = Path(t.base_model, "config.json")
            return [str(hf)] if hf.is_file() else [t.base_model]
        return [self.track_res(t.name, "base", "model.pt")]

    # ------------------------------------------------------------------ runs and evaluations
    def track_run_outputs(self, track: str, variant: str) -> dict[str, str]:
        return {k: self.track_res(track, "runs", variant, f) for k, f in RUN_FILES.items()}

    def run_outputs(self, variant: str) -> dict[str, str]:
        """The keyword track's runs: results/runs/<variant>."""
        return self.track_run_outputs(KEYWORD_TRACK, variant)

    def track_eval_outputs(self, track: str, model: str) -> dict[str, str]:
        return {k: self.track_res(track, "eval", model, f) for k, f in EVAL_FILES.items()}

    def family_run_outputs(self, family: str, variant: str, seed) -> dict[str, str]:
        d = self.family_res(family, family_run_dir(variant, seed))
        return {k: f"{d}/{f}" for k, f in RUN_FILES.items()}


def trains_tokenizer(t: Track) -> bool:
    """Whether the track trains its own tokenizer (it pretrains, or it is the keyword track, and names none)."""
    return (t.pretrains or t.name == KEYWORD_TRACK) and t.pipeline.tokenizer.path is None


def uses_dataset(t: Track, train) -> bool:
    """Whether a run reads the track's dataset (the keyword track's sorting runs do not)."""
    return t.name != KEYWORD_TRACK or train.task == "keyword_inclusion"


def user_timed(t: Track) -> bool:
    """A user's track whose variants are timed alone: it gets the systems comparison."""
    return t.name not in (KEYWORD_TRACK, MATH_TRACK) and t.timed and bool(t.pipeline.variants)
