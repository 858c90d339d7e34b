"""``rlpipe gpu-bundle OUT_DIR``: the wheels an offline CUDA machine with PyTorch lacks.

A CUDA image usually ships Python with PyTorch and the common scientific stack, but not Ray,
Snakemake and the rest of rlpipe's locked dependencies, and compute nodes often have no network.
This downloads, on a machine with the package index, one wheel per locked package the image does
not have (``requirements/lock.txt``, no dependencies resolved again: the lock is the resolution),
and the pinned packages of ``rlpipe bench trl`` that the image lacks (``BENCH_PINS``: TRL and
``datasets``; ``--no-bench`` leaves them out), for the image's Python and manylinux x86_64. It
trims the big ones of what rlpipe never imports (``TRIM``: Ray's Java jars, its
RLlib/Serve/Tune/Train/LLM libraries and dashboard client; PuLP's solvers for other platforms),
rewriting their ``RECORD`` so pip installs them cleanly; ``bundle.json`` and the last line printed
give the bundle's size. ``--no-workflow`` leaves out Snakemake and the packages only it needs (by
the lock's ``# via`` comments), for a machine that runs ``rlpipe gpu-check`` or ``rlpipe
train`` but not the workflow. On the GPU machine, in the project (the docs' GPU page):

    python3 -m pip install --no-index --no-deps --target /tmp/site OUT_DIR/*.whl
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
    python3 -m pip install --no-index --no-deps --no-build-isolation -e .

Left out: the image's packages (``IMAGE_PACKAGES``, or the names in ``--image-freeze``, the
output of ``pip list --format=freeze`` on the image), the CUDA libraries (``nvidia-*``, the
image's torch brings its own) and what only development needs (``DEV_ONLY``: docs, lint, SLURM
plugins, profilers). The image's versions of its packages may differ from the lock's:
``rlpipe gpu-check`` records every difference. ``OUT_DIR/bundle.json`` lists what was bundled,
trimmed and left out.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name

from rlpipe.bench.lock_diff import lock_pins
from rlpipe.io import atomic_path, write_json
from rlpipe.provenance import LOCK_FILE

#: what a CUDA PyTorch image (Python 3.12) brings: PyTorch, the HF stack, the scientific stack, pytest
IMAGE_PACKAGES = frozenset(canonicalize_name(n) for n in """
absl-py accelerate aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer click cloudpickle
contourpy coverage cycler filelock fonttools frozenlist fsspec grpcio h11 hf-xet httpcore httpx huggingface-hub
hypothesis idna iniconfig jinja2 kiwisolver markdown markupsafe matplotlib mpmath msgpack multidict networkx
numpy packaging pandas pillow pluggy prometheus-client propcache protobuf psutil pyarrow pygments pyparsing
pytest pytest-timeout python-dateutil pyyaml regex requests rich safetensors setuptools shellingham six
sortedcontainers sympy tabulate tensorboard tensorboard-data-server tokenizers torch tqdm transformers triton
typer typing-extensions urllib3 werkzeug wrapt xxhash yarl
""".split())
#: locked for CI or the docs, never needed to run the pipeline
DEV_ONLY = frozenset(canonicalize_name(n) for n in """
mkdocs mkdocs-material mkdocs-material-extensions mkdocstrings mkdocstrings-python mkdocs-autorefs
mkdocs-get-deps babel backrefs ghp-import griffelib mergedeep paginate pymdown-extensions pyyaml-env-tag
watchdog ruff snakemake-executor-plugin-slurm snakemake-executor-plugin-slurm-jobstep virtualenv
python-discovery distlib py-spy
""".split())
#: package -> path prefixes dropped from its wheel (rlpipe imports none of them)
TRIM = {"ray": ("ray/jars/", "ray/rllib/", "ray/serve/", "ray/tune/", "ray/train/", "ray/llm/",
                "ray/dashboard/client/build/"),
        "pulp": ("pulp/solverdir/cbc/osx/", "pulp/solverdir/cbc/win/", "pulp/solverdir/cbc/linux/arm64/",
                 "pulp/solverdir/cbc/linux/i32/")}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
#: ``rlpipe bench trl``'s packages, pinned here because the lock holds no ``bench`` extra
#: (pyproject: ``bench = ["trl>=1.16"]``): TRL as validated, and of its dependencies those a CUDA
#: PyTorch image lacks: ``datasets`` and its ``dill`` and ``multiprocess``. The rest of what they
#: require (accelerate, huggingface-hub, pyarrow, pandas, xxhash, fsspec, ...) is the image's;
#: ``datasets`` 4.8 asks for pyarrow >= 21 and huggingface-hub < 2, which an image of 2026 meets.
BENCH_PINS = ("trl==1.16.0", "datasets==4.8.5", "dill==0.4.1", "multiprocess==0.70.19")


#: ``--no-workflow``: the workflow engine, left out with every package only it needs (``rlpipe
#: gpu-check`` and ``rlpipe train`` run without it)
WORKFLOW_ONLY = frozenset({"snakemake"})


def lock_parents(lock_text: str) -> dict[str, set[str]]:
    """{locked package: the packages that require it} from the lock's ``# via`` comments (uv's
    format); the project itself (``rlpipe (pyproject.toml)``, ``-r ...``) is named ``rlpipe``."""
    parents: dict[str, set[str]] = {}
    current = None
    for line in lock_text.splitlines():
        if line[:1].isalnum():
            current = canonicalize_name(re.split(r"[=\[\s;]", line, maxsplit=1)[0])
            parents[current] = set()
        elif current is not None and line[:1].isspace() and line.strip().startswith("#"):
            via = line.strip().lstrip("#").strip().removeprefix("via").strip()
            if via:
                direct = via.startswith(("rlpipe", "-"))
                parents[current].add("rlpipe" if direct else canonicalize_name(via.split()[0].split("[")[0]))
    return parents


def only_needed_by(lock_text: str, roots: frozenset[str]) -> set[str]:
    """``roots`` and every locked package that only they (or such packages) require."""
    parents, found = lock_parents(lock_text), set(roots)
    grew = True
    while grew:
        grew = False
        for name, via in parents.items():
            if name not in found and via and via <= found:
                found.add(name)
                grew = True
    return found


def wanted(lock_text: str, image: frozenset[str], extra: tuple[str, ...] = BENCH_PINS,
           workflow: bool = True) -> tuple[list[str], dict[str, str]]:
    """(``name==version`` of every locked package to bundle, then of the ``extra`` pins the image
    and the lock lack; {left-out package: why}). One version of each package: a pin of a locked
    package gives way to the lock's. ``workflow=False`` leaves out Snakemake and what only it needs."""
    take, left_out = [], {}
    locked = lock_pins(lock_text)
    no_workflow = set() if workflow else only_needed_by(lock_text, WORKFLOW_ONLY | DEV_ONLY) - DEV_ONLY
    for name, version in locked.items():
        if name.startswith("nvidia-"):
            left_out[name] = "CUDA library (the image's torch brings its own)"
        elif name in image:
            left_out[name] = "in the image"
        elif name in DEV_ONLY:
            left_out[name] = "development only"
        elif name in no_workflow:
            left_out[name] = "workflow only (--no-workflow)"
        else:
            take.append(f"{name}=={version}")
    for req in extra:
        name = canonicalize_name(req.split("==", 1)[0])
        if name in image:
            left_out[name] = "in the image"
        elif name in locked:
            left_out.setdefault(name, f"locked at {locked[name]}")
        else:
            take.append(req)
    return take, left_out


def _dropped(name: str, prefixes: tuple[str, ...]) -> bool:
    return name.startswith(prefixes) or name.endswith(".js.map")


def trim_wheel(src: Path, dst: Path, prefixes: tuple[str, ...]) -> int:
    """Copy wheel ``src`` to ``dst`` without the files under ``prefixes`` (and source maps), its
    ``RECORD`` rewritten to match; returns the number of files dropped."""
    dropped = 0
    with zipfile.ZipFile(src) as zin, atomic_path(dst) as tmp, \
            zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if _dropped(info.filename, prefixes):
                dropped += 1
                continue
            data = zin.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = [r for r in data.decode().splitlines() if r and not _dropped(r.split(",", 1)[0], prefixes)]
                data = ("\n".join(rows) + "\n").encode()
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return dropped


def download(req: str, dest: Path, python: str) -> bool:
    """One wheel of ``req`` (no dependencies) for ``python`` on manylinux x86_64 into ``dest``; a
    package published as source only is built into a wheel here. False if neither worked."""
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    get = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           python, "--implementation", "cp", *plat, "-d", str(dest), req]
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), req]
    return any(subprocess.run(cmd, capture_output=True).returncode == 0 for cmd in (get, build))


def _wheel_name(path: Path) -> str:
    return canonicalize_name(path.name.split("-", 1)[0])


def build(out: Path, lock_text: str, image: frozenset[str], python: str,
          extra: tuple[str, ...] = BENCH_PINS, workflow: bool = True) -> dict:
    """Download, trim and place the wheels in ``out``; the manifest (also ``out/bundle.json``)."""
    take, left_out = wanted(lock_text, image, extra, workflow)
    out.mkdir(parents=True, exist_ok=True)
    missing, trimmed = [], {}
    with tempfile.TemporaryDirectory(prefix="rlpipe-bundle-") as tmp:
        for req in take:
            print(f"gpu-bundle: {req}", file=sys.stderr, flush=True)
            if not download(req, Path(tmp), python):
                missing.append(req)
        for wheel in sorted(Path(tmp).glob("*.whl")):
            name = _wheel_name(wheel)
            if name in TRIM:
                trimmed[wheel.name] = trim_wheel(wheel, out / wheel.name, TRIM[name])
            else:
                with atomic_path(out / wheel.name) as t:
                    t.write_bytes(wheel.read_bytes())
    wheels = sorted(out.glob("*.whl"))
    manifest = {"python": python, "platforms": list(PLATFORMS), "wheels": [w.name for w in wheels],
                "mib": round(sum(w.stat().st_size for w in wheels) / 2**20, 1), "trimmed_files": trimmed,
                "no_wheel": missing, "left_out": left_out}
    write_json(out / "bundle.json", manifest)
    return manifest


def image_names(freeze: Path) -> frozenset[str]:
    """Package names of a ``pip list --format=freeze`` (or ``pip freeze``) file."""
    names = set()
    for line in freeze.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            names.add(canonicalize_name(line.split("==")[0].split(" @ ")[0].split("[")[0]))
    return frozenset(names)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rlpipe gpu-bundle", description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder to put the wheels in")
    ap.add_argument("--python", default="3.12", help="the GPU image's Python version (default 3.12)")
    ap.add_argument("--image-freeze", default=None,
                    help="`pip list --format=freeze` of the image: leave out exactly its packages "
                         "(default: a typical CUDA PyTorch image's, IMAGE_PACKAGES)")
    ap.add_argument("--lock", default=str(LOCK_FILE), help="the lock file (default: the checkout's)")
    ap.add_argument("--no-bench", action="store_true",
                    help="leave out rlpipe bench trl's packages (BENCH_PINS: trl, datasets, dill, multiprocess)")
    ap.add_argument("--no-workflow", action="store_true",
                    help="leave out Snakemake and the packages only it needs: enough for "
                         "rlpipe gpu-check, rlpipe train and the benches, not for the workflow")
    ap.add_argument("--dry-run", action="store_true", help="print what would be bundled and left out; download nothing")
    a = ap.parse_args(argv)
    lock = Path(a.lock)
    if not lock.is_file():
        ap.error(f"--lock: {lock} does not exist")
    if a.image_freeze and not Path(a.image_freeze).is_file():
        ap.error(f"--image-freeze: {a.image_freeze} does not exist")
    image = image_names(Path(a.image_freeze)) if a.image_freeze else IMAGE_PACKAGES
    extra = () if a.no_bench else BENCH_PINS
    if a.dry_run:
        take, left_out = wanted(lock.read_text(), image, extra, not a.no_workflow)
        print("\n".join(take))
        print(f"# left out: {len(left_out)} ({', '.join(sorted(left_out))})", file=sys.stderr)
        return 0
    manifest = build(Path(a.out), lock.read_text(), image, a.python, extra, not a.no_workflow)
    print(f"rlpipe gpu-bundle: {len(manifest['wheels'])} wheels, {manifest['mib']} MiB -> {a.out}")
    if manifest["no_wheel"]:
        print(f"rlpipe gpu-bundle: no wheel for {', '.join(manifest['no_wheel'])}", file=sys.stderr)
        return 1
    return 0
