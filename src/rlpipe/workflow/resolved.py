"""The resolved config files every command reads.

Rerun policy (why params and the config file look the way they do):
- Every command reads the resolved config from a content-addressed file,
  results/config/<name>-<hash>.yaml, named when the workflow is parsed, written (atomically, only if
  absent) when it starts running jobs (onstart: a dry run, --report, --lint or an invocation that
  fails before its first job leaves nothing in results/config/), and passed as a resource or a
  global, never as an input. An edit therefore gives a new file and changes no input, and a lost
  .snakemake directory can never leave a command reading a stale config.
- Every stage declares the config sections it depends on as `params`, in canonical JSON
  (rlpipe.workflow.params), and Snakemake's params trigger reruns exactly the stages whose settings
  changed, in the same invocation.

A config's file is named lazily, when first asked for (a family's only when one of its jobs or the
start of the run needs it), so that a cluster job's parse does not dump and hash every family's config.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import yaml

from rlpipe import io
from rlpipe.config import to_dict


def resolved_text(cfg: Any) -> str:
    """A config as the YAML its file holds."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def resolved_path(results: str, name: str, text: str) -> str:
    """results/config/<name>-<hash of its content>.yaml."""
    return f"{results}/config/{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"


class ResolvedConfigs:
    """path -> text of every resolved config this invocation's jobs may read (``path``), written by
    ``write_all`` when jobs are about to run."""

    def __init__(self, results: str):
        self.results = results
        self.texts: dict[str, str] = {}

    def path(self, name: str, cfg: Any) -> str:
        """The path results/config/<name>-<hash of its content>.yaml of ``cfg``; the file is written
        (once: only if absent) by ``write_all``."""
        text = resolved_text(cfg)
        path = resolved_path(self.results, name, text)
        self.texts[path] = text
        return path

    def lazy(self, names: list[str], name_of: Callable[[str], str], cfg_of: Callable[[str], Any]) -> LazyPaths:
        """key -> path of ``cfg_of(key)`` as file ``name_of(key)``, named on first access."""
        return LazyPaths(self, names, name_of, cfg_of)

    def write_all(self, *lazy: LazyPaths) -> None:
        """Write every named config that is absent (the lazy ones named first)."""
        for paths in lazy:
            paths.name_all()
        for path, text in self.texts.items():
            if not os.path.exists(path):
                io.write_text(path, text)


class LazyPaths(Mapping):
    """A read-only mapping key -> resolved config path whose values are computed on first access."""

    def __init__(self, configs: ResolvedConfigs, keys: list[str], name_of: Callable[[str], str],
                 cfg_of: Callable[[str], Any]):
        self._configs, self._keys, self._name_of, self._cfg_of = configs, list(keys), name_of, cfg_of
        self._paths: dict[str, str] = {}

    def __getitem__(self, key: str) -> str:
        if key not in self._paths:
            if key not in self._keys:
                raise KeyError(key)
            self._paths[key] = self._configs.path(self._name_of(key), self._cfg_of(key))
        return self._paths[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def name_all(self) -> None:
        for key in self._keys:
            self[key]
