"""The installed packages whose versions differ from ``requirements/lock.txt`` (``rlpipe gpu-check``
records them: a CUDA image brings its own torch and friends), and the lock's pins (``rlpipe
gpu-bundle`` reads them). Standard library and ``packaging`` only: no torch."""

from __future__ import annotations

import re
from importlib import metadata

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

#: the lock's packages a CUDA image installs its own way, or that CI alone uses (never a difference)
NOT_COMPARED = {"pip", "setuptools", "wheel", "rlpipe"}


def lock_pins(text: str) -> dict[str, str]:
    """{canonical name: pinned version} of every ``name==version`` line of a lock file's text."""
    pins = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9._-]+)(\[[^\]]*\])?==([^\s;#]+)", line.strip())
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(3)
    return pins


def _same(installed: str, pinned: str) -> bool:
    try:
        return Version(installed) == Version(pinned)
    except InvalidVersion:
        return installed == pinned


def lock_differences(lock_text: str, installed: dict[str, str | None] | None = None) -> dict[str, dict]:
    """{package: {"lock": pinned, "installed": version or None}} for every locked package whose
    installed version differs (``installed`` defaults to this environment's, by package metadata)."""
    pins = lock_pins(lock_text)
    if installed is None:
        installed = {}
        for name in pins:
            try:
                installed[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                installed[name] = None
    out = {}
    for name, pinned in sorted(pins.items()):
        if name in NOT_COMPARED:
            continue
        have = installed.get(name)
        if have is None or not _same(have, pinned):
            out[name] = {"lock": pinned, "installed": have}
    return out
