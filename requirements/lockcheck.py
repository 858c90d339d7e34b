"""Does requirements/lock.txt agree with pyproject.toml, and with what is installed?

    python requirements/lockcheck.py digest      # the hash lock.sh writes into the lock's header
    python requirements/lockcheck.py check       # pyproject.toml vs the lock (exit 1 on a disagreement)
    python requirements/lockcheck.py installed   # the lock vs this environment (exit 1 on a difference)

Used by requirements/lock.sh and tests/test_lock.py. Only the standard library and `packaging`
(which pip vendors and every environment here has) are needed.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "lock.txt"
PYPROJECT = ROOT / "pyproject.toml"
LOCKED_EXTRAS = ("test", "docs")
DIGEST_LINE = re.compile(r"^# pyproject-deps-sha256: ([0-9a-f]{64})$", re.M)
# Installed but never locked: the installer itself, the project, and uv (only for lock.sh).
NOT_LOCKED = {"pip", "setuptools", "wheel", "rlpipe", "uv"}


def locked_requirements() -> list[str]:
    """pyproject.toml's requirements that the lock covers: the core list and the locked extras."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return list(project["dependencies"]) + [r for e in LOCKED_EXTRAS for r in extras.get(e, [])]


def pyproject_digest() -> str:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    payload = {"requires-python": project.get("requires-python"), "dependencies": project["dependencies"],
               "extras": {e: extras.get(e, []) for e in LOCKED_EXTRAS}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def lock_pins(text: str | None = None) -> dict[str, Version]:
    """{canonical name: pinned version} of every `name==version` line of the lock."""
    text = LOCK.read_text() if text is None else text
    pins = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9._-]+)(\[[^\]]*\])?==([^\s;#]+)", line)
        if m:
            pins[canonicalize_name(m.group(1))] = Version(m.group(3))
    return pins


def lock_sha256() -> str | None:
    """sha256 of the lock file, or None where rlpipe runs outside a checkout that has one."""
    return hashlib.sha256(LOCK.read_bytes()).hexdigest() if LOCK.is_file() else None


def disagreements() -> list[str]:
    """Why the lock does not match pyproject.toml (empty when it does)."""
    if not LOCK.is_file():
        return [f"{LOCK} is missing: run `bash requirements/lock.sh`"]
    text = LOCK.read_text()
    problems = []
    m = DIGEST_LINE.search(text)
    if not m or m.group(1) != pyproject_digest():
        problems.append("pyproject.toml's dependency lists changed since requirements/lock.txt was generated "
                        "(its pyproject-deps-sha256 header differs): run `bash requirements/lock.sh`")
    pins = lock_pins(text)
    for spec in locked_requirements():
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name not in pins:
            problems.append(f"{req.name} (pyproject.toml: {spec!r}) is not pinned in requirements/lock.txt")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"requirements/lock.txt pins {req.name}=={pins[name]}, outside pyproject.toml's "
                            f"{spec!r}")
    return problems


def installed_differences() -> list[str]:
    """How this environment differs from the lock: a locked package at another version, or an
    installed package the lock does not list."""
    pins = lock_pins()
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in metadata.distributions()}
    problems = []
    for name, have in sorted(installed.items()):
        if name in NOT_LOCKED:
            continue
        want = pins.get(name)
        if want is None:
            problems.append(f"{name}=={have} is installed but not in requirements/lock.txt")
        elif have.public != want.public:  # the local label (+cpu, +cu128) is the machine's choice
            problems.append(f"{name}=={have} is installed; requirements/lock.txt pins {want}")
    return problems


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "check"
    if cmd == "digest":
        print(pyproject_digest())
        return 0
    problems = {"check": disagreements, "installed": installed_differences}[cmd]()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
