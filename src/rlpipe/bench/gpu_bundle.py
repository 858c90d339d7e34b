"""``rlpipe gpu-bundle OUT_DIR``: the wheels an offline CUDA machine with PyTorch lacks.

A CUDA image usually ships Python with PyTorch and the common scientific stack, but not Ray,
Snakemake and the rest of rlpipe's locked dependencies, and compute nodes often have no network.
This downloads, on a machine with the package index, one wheel per locked package the image does
not have (``requirements/lock.txt``, no dependencies resolved again: the lock is the resolution),
and the pinned packages of ``rlpipe bench trl`` that the image lacks (``BENCH_PINS``: TRL and
``datasets``; ``--no-bench`` leaves them out), with ``--nccl 12|13`` CuPy for Ray's NCCL weight sync
(``NCCL_PINS``), for the image's Python and manylinux x86_64: a wheel built for another Python or
platform is never added (``fits``). Every bundled wheel's requirements are checked against the
versions the GPU machine will have (the lock's, the image's from ``--image-freeze``, the bundle's
own pins): a requirement none of them has is fetched too (``complete``: pip picks the version,
``added_for_requirements`` in ``bundle.json``), and a conflict is named (``conflicts``) and the
command exits 1. It
trims the big ones of what rlpipe never imports (``TRIM``: Ray's Java jars, its
RLlib/Serve/Tune/Train/LLM libraries and dashboard client; PuLP's solvers for other platforms),
rewriting their ``RECORD`` so pip installs them cleanly; ``bundle.json`` and the last line printed
give the bundle's size. ``--no-workflow`` leaves out Snakemake and the packages only it needs (by
the lock's ``# via`` comments), for a machine that runs ``rlpipe gpu-check`` or ``rlpipe
train`` but not the workflow. The W&B and MLflow clients (``TRACKERS_ONLY``, for ``logging.trackers``)
are left out the same way unless ``--trackers``. On the GPU machine, in the project (the docs' GPU page): a venv
that sees the image's packages through ``image.pth`` (an image whose Python is itself a venv
included, the ``.pth`` files in its site-packages too: ``site.addsitedir``; pip installs into a venv
even where the image's Python is externally managed, PEP 668), then the wheels and the project,
offline:

    python3 -m venv --without-pip --system-site-packages .venv-gpu
    python3 -c 'import os, site, sys; d = site.getsitepackages(); \\
        b = site.getsitepackages([sys.base_prefix, sys.base_exec_prefix]); \\
        print("import site; list(map(site.addsitedir, %r))" % [p for p in d if p not in b and os.path.isdir(p)], \\
        *[p for p in d if p in b], sep="\\n")' > "$(.venv-gpu/bin/python -c \\
        'import sysconfig; print(sysconfig.get_path("purelib"))')/image.pth"
    . .venv-gpu/bin/activate
    python -m pip install --no-index --no-deps OUT_DIR/*.whl
    python -m pip install --no-index --no-deps --no-build-isolation -e .

Left out: the image's packages (``IMAGE_PACKAGES``, or the names in ``--image-freeze``, the
output of ``pip list --format=freeze`` on the image), the CUDA libraries (``nvidia-*`` but NVML's
``nvidia-ml-py``: the image's torch brings its own) and what only development needs (``DEV_ONLY``: docs, lint, SLURM
plugins, profilers). The image's versions of its packages may differ from the lock's:
``rlpipe gpu-check`` records every difference. ``OUT_DIR/bundle.json`` lists what was bundled,
trimmed and left out.
"""

from __future__ import annotations

import argparse
import email.parser
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from rlpipe.bench.lock_diff import lock_pins
from rlpipe.io import atomic_path, write_json
from rlpipe.provenance import LOCK_FILE

#: what a CUDA PyTorch image (Python 3.12) brings: PyTorch, the HF stack, the scientific stack, pytest
IMAGE_PACKAGES = frozenset(canonicalize_name(n) for n in """
absl-py accelerate aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer click
cloudpickle colorama contourpy coverage cycler filelock fonttools frozenlist fsspec grpcio h11 hf-xet httpcore httpx
huggingface-hub hypothesis idna iniconfig jinja2 kiwisolver markdown markdown-it-py markupsafe matplotlib mdurl
mpmath msgpack multidict networkx numpy packaging pandas pathspec pillow pluggy prometheus-client propcache protobuf
psutil pyarrow pygments pyparsing pytest pytest-timeout python-dateutil pyyaml regex requests rich safetensors
setuptools shellingham six
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
#: ``nvidia-*`` packages that are no CUDA library: NVML's Python binding (``pynvml``), which
#: ``torch.cuda.utilization`` imports for the GPU busy fraction and which the image may lack
NOT_CUDA = frozenset({"nvidia-ml-py"})
#: ``rlpipe bench trl``'s packages, pinned here because the lock holds no ``bench`` extra
#: (pyproject: ``bench = ["trl>=1.16"]``): TRL as validated, and of its dependencies those a CUDA
#: PyTorch image lacks: ``datasets`` and its ``dill`` and ``multiprocess``. The rest of what they
#: require (accelerate, huggingface-hub, pyarrow, pandas, xxhash, fsspec, ...) is the image's or the
#: lock's, and ``build`` checks every requirement against them: ``datasets`` 5.2 accepts the lock's
#: huggingface-hub 2 and fsspec (4.8 required huggingface-hub < 2 and an older fsspec).
BENCH_PINS = ("trl==1.16.0", "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19")
#: ``--nccl CUDA_MAJOR``: CuPy for that CUDA (Ray's NCCL collective imports ``cupy.cuda.nccl``;
#: ``config/gpu.yaml``'s ``disagg_rdt`` on two GPUs) and its one requirement beyond numpy
NCCL_PINS = {"12": ("cupy-cuda12x==14.2.0", "cuda-pathfinder==1.9.1"),
             "13": ("cupy-cuda13x==14.2.0", "cuda-pathfinder==1.9.1")}


#: ``--no-workflow``: the workflow engine, left out with every package only it needs (``rlpipe
#: gpu-check`` and ``rlpipe train`` run without it)
WORKFLOW_ONLY = frozenset({"snakemake"})
#: the W&B and MLflow clients (``logging.trackers``, locked for CI's tests), left out with every package
#: only they need unless ``--trackers``: most of a bundle's size, and no GPU check uses them
TRACKERS_ONLY = frozenset({"wandb", "mlflow-skinny", "mlflow"})


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


def optional_parts(lock_text: str, workflow: bool, trackers: bool) -> dict[str, str]:
    """{locked package: why it is left out} for the parts not asked for: Snakemake (``workflow``) and
    the trackers' clients (``trackers``), each with what only it (or only the parts left out) needs."""
    roots = (frozenset() if workflow else WORKFLOW_ONLY) | (frozenset() if trackers else TRACKERS_ONLY)
    if not roots:
        return {}
    workflow_side = set() if workflow else only_needed_by(lock_text, WORKFLOW_ONLY | DEV_ONLY)
    return {name: ("workflow only (--no-workflow)" if name in workflow_side
                   else "experiment trackers only (--trackers adds them)")
            for name in only_needed_by(lock_text, roots | DEV_ONLY) - DEV_ONLY}


def wanted(lock_text: str, image: frozenset[str], extra: tuple[str, ...] = BENCH_PINS,
           workflow: bool = True, trackers: bool = False) -> tuple[list[str], dict[str, str]]:
    """(``name==version`` of every locked package to bundle, then of the ``extra`` pins the image
    and the lock lack; {left-out package: why}). One version of each package: a pin of a locked
    package gives way to the lock's. ``workflow=False`` leaves out Snakemake and what only it needs;
    ``trackers=False`` (the default) the W&B and MLflow clients and what only they need."""
    take, left_out = [], {}
    locked = lock_pins(lock_text)
    optional = optional_parts(lock_text, workflow, trackers)
    for name, version in locked.items():
        if name.startswith("nvidia-") and name not in NOT_CUDA:
            left_out[name] = "CUDA library (the image's torch brings its own)"
        elif name in image:
            left_out[name] = "in the image"
        elif name in DEV_ONLY:
            left_out[name] = "development only"
        elif name in optional:
            left_out[name] = optional[name]
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


def fits(wheel_name: str, python: str) -> bool:
    """Whether a wheel installs on the target: CPython ``python`` (``3.12``) on manylinux x86_64. A
    pure wheel (``py3-none-any``, or ``cp312-none-any``) or one built for that Python (its ABI or
    ``abi3``) on one of ``PLATFORMS``, or one for any Python 3 on those platforms (``py3-none-
    manylinux_2_28_x86_64``: W&B's, whose binary does not link Python); never a wheel for the host's
    Python or platform."""
    try:
        tags = parse_wheel_filename(wheel_name)[3]
    except InvalidWheelFilename:
        return False
    major, minor = (int(x) for x in python.split(".")[:2])
    cp = f"cp{major}{minor}"
    abi3_from = {f"cp{major}{m}" for m in range(2, minor + 1)}  # the stable ABI of this Python or an older one
    for tag in tags:
        python_free = tag.abi == "none" and tag.interpreter in (f"py{major}", f"py{major}{minor}", cp)
        if python_free and tag.platform in ("any", *PLATFORMS):  # pure, or a binary not linking Python
            return True
        if tag.platform in PLATFORMS and ((tag.interpreter, tag.abi) == (cp, cp)
                                          or (tag.abi == "abi3" and tag.interpreter in abi3_from)):
            return True
    return False


def download(req: str, dest: Path, python: str) -> tuple[Path | None, str | None]:
    """One wheel of ``req`` (no dependencies) for ``python`` on manylinux x86_64, in ``dest``: the
    index's wheel, else one built here from the source, kept only if it ``fits`` the target (a
    pure-Python package). ``(wheel, None)``, or ``(None, why not)``."""
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    get = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           python, "--implementation", "cp", *plat]
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps"]
    why = [f"no wheel for CPython {python} on manylinux x86_64"]
    for cmd, how in ((get, "downloaded"), (build, "built here")):
        with tempfile.TemporaryDirectory(prefix="rlpipe-wheel-") as tmp:
            if subprocess.run([*cmd, "-d" if cmd is get else "-w", tmp, req], capture_output=True).returncode:
                continue
            for wheel in Path(tmp).glob("*.whl"):
                if fits(wheel.name, python):
                    target = dest / wheel.name
                    target.write_bytes(wheel.read_bytes())
                    return target, None
                why.append(f"the wheel {how} ({wheel.name}) is for another Python or platform")
    return None, "; ".join(why)


def _wheel_name(path: Path) -> str:
    return canonicalize_name(path.name.split("-", 1)[0])


def wheel_requirements(wheel: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        msg = email.parser.Parser().parsestr(z.read(meta).decode("utf-8", "replace"), headersonly=True)
    return msg["Name"], msg["Version"], msg.get_all("Requires-Dist") or []


def applicable_requirements(wheel: Path, python: str) -> tuple[str, str, list[tuple[str, Requirement]]]:
    """(name, version, [(Requires-Dist line, requirement)]) of ``wheel``, keeping the requirements
    that apply to CPython ``python`` on Linux x86_64 without extras."""
    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    name, version, requires = wheel_requirements(wheel)
    kept = []
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate(env):
            kept.append((line, req))
    return name, version, kept


def complete(folder: Path, versions: dict[str, str | None], python: str,
             fetch=None) -> tuple[dict[str, str], dict[str, str]]:
    """Add to ``folder`` a wheel for every requirement of its wheels whose package the GPU machine
    will not have (``versions``: the lock's, the image's and the bundle's), and so on for the added
    wheels' own requirements, until none is missing. pip picks each added version (``download``,
    no dependencies: what the lock or the image already has is never fetched again); ``versions``
    grows by them. Returns ({requirement: wheel added}, {requirement: why no wheel})."""
    fetch = fetch or download
    added, missing = {}, {}
    seen: set[str] = set()
    while True:
        wanted_now = {}
        for wheel in sorted(folder.glob("*.whl")):
            if wheel.name in seen:
                continue
            seen.add(wheel.name)
            for _line, req in applicable_requirements(wheel, python)[2]:
                dep = canonicalize_name(req.name)
                if dep not in versions and dep not in wanted_now:
                    wanted_now[dep] = f"{dep}{req.specifier}"
        if not wanted_now:
            return added, missing
        for dep, req in wanted_now.items():
            print(f"gpu-bundle: {req} (a bundled wheel's requirement)", file=sys.stderr, flush=True)
            wheel, why = fetch(req, folder, python)
            if wheel is None:
                missing[req] = why
                versions[dep] = None  # named once, as a missing wheel; not retried
            else:
                added[req] = wheel.name
                versions[dep] = wheel_requirements(wheel)[1]


def conflicts(wheels: list[Path], versions: dict[str, str | None], python: str) -> list[str]:
    """Every requirement of ``wheels`` (for CPython ``python`` on Linux x86_64, no extras) that the
    GPU machine will not meet: ``versions`` is {package: version} of what it will have (the lock's
    and the image's packages, the bundle's own; None: a version not known, taken as met). One line
    per conflict, naming the package, its requirement and the version it would get."""
    found = []
    for wheel in wheels:
        name, version, requires = applicable_requirements(wheel, python)
        for line, req in requires:
            dep = canonicalize_name(req.name)
            if dep not in versions:
                found.append(f"{name} {version} requires {line}, which neither the lock, the image nor the bundle has")
                continue
            have = versions[dep]
            try:
                ok = have is None or req.specifier.contains(Version(have), prereleases=True)
            except InvalidVersion:
                ok = True
            if not ok:
                found.append(f"{name} {version} requires {line}, but the GPU machine gets {req.name} {have}")
    return found


def machine_versions(lock_text: str, image: frozenset[str], image_versions: dict[str, str],
                     bundled: list[str]) -> dict[str, str | None]:
    """{package: version} the GPU machine will have: the image's packages (their version from
    ``--image-freeze``; without it the lock's, the lock being the resolution; else unknown) and the
    bundled ``name==version`` pins."""
    locked = {n: str(v) for n, v in lock_pins(lock_text).items()}
    have: dict[str, str | None] = {n: image_versions.get(n, locked.get(n)) for n in image}
    return have | {canonicalize_name(r.split("==")[0]): r.split("==")[1] for r in bundled}


def build(out: Path, lock_text: str, image: frozenset[str], python: str,
          extra: tuple[str, ...] = BENCH_PINS, workflow: bool = True,
          image_versions: dict[str, str] | None = None, trackers: bool = False) -> dict:
    """Download, check, trim and place the wheels in ``out``; the manifest (also ``out/bundle.json``)."""
    take, left_out = wanted(lock_text, image, extra, workflow, trackers)
    out.mkdir(parents=True, exist_ok=True)
    missing, trimmed = {}, {}
    with tempfile.TemporaryDirectory(prefix="rlpipe-bundle-") as tmp:
        for req in take:
            print(f"gpu-bundle: {req}", file=sys.stderr, flush=True)
            wheel, why = download(req, Path(tmp), python)
            if wheel is None:
                missing[req] = why
        have = machine_versions(lock_text, image, image_versions or {}, take)
        added, not_found = complete(Path(tmp), have, python)
        missing |= not_found
        got = sorted(Path(tmp).glob("*.whl"))
        clash = conflicts(got, have, python)
        for wheel in got:
            name = _wheel_name(wheel)
            if name in TRIM:
                trimmed[wheel.name] = trim_wheel(wheel, out / wheel.name, TRIM[name])
            else:
                with atomic_path(out / wheel.name) as t:
                    t.write_bytes(wheel.read_bytes())
    wheels = sorted(out.glob("*.whl"))
    manifest = {"python": python, "platforms": list(PLATFORMS), "wheels": [w.name for w in wheels],
                "mib": round(sum(w.stat().st_size for w in wheels) / 2**20, 1), "trimmed_files": trimmed,
                "no_wheel": missing, "conflicts": clash, "added_for_requirements": added, "left_out": left_out}
    write_json(out / "bundle.json", manifest)
    return manifest


def image_versions(freeze: Path) -> dict[str, str | None]:
    """{package: version} of a ``pip list --format=freeze`` (or ``pip freeze``) file; None for a
    line without ``==`` (``name @ url``)."""
    found: dict[str, str | None] = {}
    for line in freeze.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.split(" @ ")[0].partition("==")
            found[canonicalize_name(name.split("[")[0])] = version.strip() or None
    return found


def image_names(freeze: Path) -> frozenset[str]:
    """Package names of a ``pip list --format=freeze`` (or ``pip freeze``) file."""
    return frozenset(image_versions(freeze))


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
    ap.add_argument("--trackers", action="store_true",
                    help="also bundle the W&B and MLflow clients (logging.trackers), left out by default")
    ap.add_argument("--nccl", choices=sorted(NCCL_PINS), default=None, metavar="CUDA_MAJOR",
                    help="add CuPy for that CUDA major version (12 or 13: the image torch's CUDA), which Ray's "
                         "NCCL weight sync needs (two GPUs, config/gpu.yaml's disagg_rdt)")
    ap.add_argument("--dry-run", action="store_true", help="print what would be bundled and left out; download nothing")
    a = ap.parse_args(argv)
    lock = Path(a.lock)
    if not lock.is_file():
        ap.error(f"--lock: {lock} does not exist")
    if a.image_freeze and not Path(a.image_freeze).is_file():
        ap.error(f"--image-freeze: {a.image_freeze} does not exist")
    versions = image_versions(Path(a.image_freeze)) if a.image_freeze else {}
    image = frozenset(versions) if a.image_freeze else IMAGE_PACKAGES
    extra = (() if a.no_bench else BENCH_PINS) + (NCCL_PINS[a.nccl] if a.nccl else ())
    if a.dry_run:
        take, left_out = wanted(lock.read_text(), image, extra, not a.no_workflow, a.trackers)
        print("\n".join(take))
        print(f"# left out: {len(left_out)} ({', '.join(sorted(left_out))})", file=sys.stderr)
        return 0
    manifest = build(Path(a.out), lock.read_text(), image, a.python, extra, not a.no_workflow,
                     {n: v for n, v in versions.items() if v}, a.trackers)
    print(f"rlpipe gpu-bundle: {len(manifest['wheels'])} wheels, {manifest['mib']} MiB -> {a.out}")
    for req, why in manifest["no_wheel"].items():
        print(f"rlpipe gpu-bundle: {req}: {why}", file=sys.stderr)
    for line in manifest["conflicts"]:
        print(f"rlpipe gpu-bundle: conflict: {line}", file=sys.stderr)
    return 1 if manifest["no_wheel"] or manifest["conflicts"] else 0
