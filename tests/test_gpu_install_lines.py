"""The GPU page's install lines (docs/gpu-and-clusters.md, the bundle's venv; repeated in
``rlpipe.bench.gpu_bundle``'s docstring), run verbatim, offline, on a fake CUDA image whose Python pip
treats as externally managed (PEP 668): the naive ``python3 -m pip install`` into that Python is
refused, and the documented lines give a venv that sees the image's packages, holds the bundle's wheels
and the project as an editable install, and leaves the image's site-packages untouched.

The fake image costs no copy of the standard library: a prefix whose ``bin/python3.X`` is a copy of the
suite's own base interpreter (a few KB for a shared-libpython build; it finds its prefix by the landmark
``lib/python3.X/os.py``), whose ``lib/python3.X/`` links every entry of the real standard library beside
its own ``EXTERNALLY-MANAGED`` file, and whose site-packages links the suite's pip and setuptools (the
project needs setuptools>=68, more than Debian's python3 has) and holds ``.pth`` files, as images do
for packages installed in place (editable installs): one with a path line, one with an executable
``import`` line."""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "gpu-and-clusters.md"
BUNDLE = ROOT / "src" / "rlpipe" / "bench" / "gpu_bundle.py"
FIRST = "python3 -m venv"  # the block's first command: the venv the rest installs into
WHEEL_PKG = "gpu_bundle_probe"  # the bundle's stand-in: one small pure-Python wheel
PTH_PKG = "image_pth_probe"  # an image package reached only through a .pth file's path line in its site-packages
PTH_HOOK_PKG = "image_pth_hook_probe"  # one reached only through a .pth file's import line (an editable finder's)
TIMEOUT = 180


def _doc_lines() -> list[str]:
    """The commands of the docs' ```bash block that starts with the venv (the one that installs the bundle)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", DOC.read_text(), flags=re.M | re.S)
    found = [b for b in blocks if b.startswith(FIRST) and ".venv-gpu" in b]
    assert len(found) == 1, f"{DOC.name}: expected one ```bash block starting with {FIRST!r}, found {len(found)}"
    return [line for line in found[0].splitlines() if line.strip()]


def _normalized(command: str) -> str:
    return " ".join(command.split())


def test_gpu_bundle_docstring_carries_the_docs_install_lines():
    """``rlpipe.bench.gpu_bundle``'s docstring repeats the docs' lines: the same commands once its
    ``OUT_DIR`` is the docs' ``wheels/`` and its line continuation is joined (read from the source, so
    the docstring's ``\\n`` and ``\\`` are what a reader copies)."""
    doc = ast.get_docstring(ast.parse(BUNDLE.read_text()), clean=True)
    start = doc.index(FIRST)
    block = doc[start:].split("\n\n", 1)[0].replace("\\\n", " ").replace("OUT_DIR/", "wheels/")
    assert [_normalized(line) for line in block.splitlines()] == [_normalized(line) for line in _doc_lines()]


def _wheel(out: Path) -> Path:
    """A real (tiny, pure-Python) wheel, written by hand: name, version, tag and a RECORD with hashes."""
    dist = f"{WHEEL_PKG}-1.0"
    files = {
        f"{WHEEL_PKG}/__init__.py": "VALUE = 42\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {WHEEL_PKG}\nVersion: 1.0\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def _env(image_bin: Path) -> dict[str, str]:
    """The child's environment: the image's ``python3`` first on PATH, nothing of the suite's venv
    (VIRTUAL_ENV, its bin on PATH), no PYTHONPATH or PIP_* setting (PIP_BREAK_SYSTEM_PACKAGES would
    defeat the check), no user site-packages and no pip cache or version check."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP") and not k.startswith("PIP_")}
    outer_bin = str(Path(sys.prefix) / "bin") if sys.prefix != sys.base_prefix else None
    path = [p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p and p != outer_bin]
    env["PATH"] = os.pathsep.join([str(image_bin), *path])
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1", PIP_NO_INPUT="1", PYTHONNOUSERSITE="1")
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def _ask(python: Path, code: str, env: dict[str, str], cwd: Path):
    r = _run([str(python), "-c", f"import json, sys\n{code}"], cwd, env)
    assert r.returncode == 0, f"{python}: {r.stderr[-3000:]}"
    return json.loads(r.stdout)


def _fake_python(root: Path) -> Path:
    """The fake image's ``python3`` (see the module docstring), checked to take ``root`` as its prefix."""
    base = Path(sys._base_executable).resolve()  # the suite's interpreter, outside any venv
    stdlib = Path(sysconfig.get_path("stdlib"))  # in a venv: the base interpreter's
    assert (stdlib / "os.py").is_file(), stdlib
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(base, root / "bin" / ver)  # a copy, not a link: a link would resolve to the real prefix
    (root / "bin" / "python3").symlink_to(ver)
    lib = root / "lib" / ver
    lib.mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name not in ("site-packages", "dist-packages", "EXTERNALLY-MANAGED", "__pycache__"):
            (lib / entry.name).symlink_to(entry)
    (lib / "EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=this is the fake image's Python\n")
    python = root / "bin" / "python3"
    code = "import sysconfig\nprint(json.dumps([sys.prefix, sys.exec_prefix, sysconfig.get_path('stdlib')]))"
    where = _ask(python, code, _env(root / "bin"), root)
    assert where == [str(root), str(root), str(lib)], f"the fake image's Python found another prefix: {where}"
    return python


def _stock(python: Path, env: dict[str, str], root: Path) -> Path:
    """The image's site-packages (the first of ``site.getsitepackages()``, under ``root``), given the
    suite's pip and setuptools (links to their top-level entries, by RECORD) and two packages that only
    ``.pth`` files there reach: a path line's and an executable line's."""
    found = _ask(python, "import site\nprint(json.dumps([sys.prefix, site.getsitepackages()]))", env, root)
    assert found[0] == str(root), found
    site_dir = Path(found[1][0])
    assert site_dir.is_relative_to(root), found
    site_dir.mkdir(parents=True, exist_ok=True)
    for name in ("pip", "setuptools"):
        dist = metadata.distribution(name)
        for top in {f.parts[0] for f in dist.files or () if f.parts[0] not in ("..", "__pycache__")}:
            src = Path(dist.locate_file(top))
            if src.exists() and not (site_dir / top).exists():
                (site_dir / top).symlink_to(src)
    (root / "extra" / PTH_PKG).mkdir(parents=True)
    (root / "extra" / PTH_PKG / "__init__.py").write_text("")
    (site_dir / f"{PTH_PKG}.pth").write_text(f"{root / 'extra'}\n")
    (root / "hooked" / PTH_HOOK_PKG).mkdir(parents=True)
    (root / "hooked" / PTH_HOOK_PKG / "__init__.py").write_text("")
    hooked = str(root / "hooked")
    (site_dir / f"{PTH_HOOK_PKG}.pth").write_text(f"import sys; p = {hooked!r}; p in sys.path or sys.path.append(p)\n")
    return site_dir


def _tree(*paths: Path) -> list[tuple[str, int, int]]:
    """Every entry under ``paths`` (links not followed) with its size and mtime: a write shows. Not the
    bytecode caches (``__pycache__``) that the image's Python writes for what it imports, as any Python
    does where PYTHONDONTWRITEBYTECODE is unset: they are no install's."""
    out = []
    for path in paths:
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in dirnames + filenames:
                st = os.lstat(os.path.join(dirpath, name))
                out.append((os.path.join(dirpath, name), st.st_size, st.st_mtime_ns))
    return sorted(out)


@pytest.mark.parametrize("image_kind", ["system", "venv"])
def test_install_lines_on_an_externally_managed_image(tmp_path, image_kind):
    """The docs' lines, run as written in a copy of the project (pyproject.toml, README.md, src/) with a
    wheel in ``wheels/``, on the fake image: ``system``, its Python marked externally managed, where
    first ``python3 -m pip install`` of the wheel is refused with pip's externally-managed-environment
    error and installs nothing; ``venv``, the image's Python a venv of that Python holding the image's
    packages, which the new venv's ``--system-site-packages`` alone would not reach (``image.pth``
    does). Then the venv's Python is based on the image's, imports the image's pip from the image's
    site-packages, the wheel's package from the venv, rlpipe from the copy as an editable install
    (``pip show``), and the image packages that only ``.pth`` files in the image's site-packages reach,
    by a path line and by an ``import`` line (on ``venv``, ``image.pth``'s ``site.addsitedir`` reads
    them: a plain path line in a ``.pth`` file is not scanned for ``.pth`` files); nothing is written
    into the image's site-packages."""
    if Version(metadata.version("setuptools")) < Version("68"):
        pytest.skip("the suite's setuptools is older than the project's build requirement (setuptools>=68)")
    base = tmp_path / "image"
    python = _fake_python(base)
    image = base if image_kind == "system" else tmp_path / "image-venv"
    if image_kind == "venv":
        made = _run([str(python), "-m", "venv", "--without-pip", str(image)], tmp_path, _env(base / "bin"))
        assert made.returncode == 0, made.stderr
        python = image / "bin" / "python3"
    env = _env(image / "bin")
    image_site = _stock(python, env, image)
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, proj / name)
    shutil.copytree(ROOT / "src", proj / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheel = _wheel(proj / "wheels")
    before = _tree(base, image)

    if image_kind == "system":
        naive = _run([str(python), "-m", "pip", "install", "--no-index", "--no-deps", str(wheel)], proj, env)
        assert naive.returncode != 0, f"pip installed into the externally managed image:\n{naive.stdout}"
        assert "externally-managed-environment" in naive.stderr, naive.stderr
        assert _tree(base, image) == before

    script = proj / "install.sh"
    script.write_text("set -eo pipefail\n" + "\n".join(_doc_lines()) + "\n")
    r = _run(["bash", str(script)], proj, env)
    assert r.returncode == 0, f"the docs' install lines failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"

    venv = proj / ".venv-gpu"
    seen = _ask(venv / "bin" / "python", f"import importlib.util, pip, {WHEEL_PKG}\n"
                "print(json.dumps({'prefix': sys.prefix, 'base': sys.base_prefix, 'pip': pip.__file__,\n"
                f"  'pth_pkg': getattr(importlib.util.find_spec('{PTH_PKG}'), 'origin', None),\n"
                f"  'pth_hook_pkg': getattr(importlib.util.find_spec('{PTH_HOOK_PKG}'), 'origin', None),\n"
                f"  'wheel_pkg': {WHEEL_PKG}.__file__, 'value': {WHEEL_PKG}.VALUE,\n"
                "  'rlpipe': importlib.util.find_spec('rlpipe').origin}))", env, tmp_path)
    assert seen["prefix"] == str(venv) and seen["base"] == str(base), seen
    assert Path(seen["pip"]).is_relative_to(image_site), seen["pip"]
    assert seen["pth_pkg"] and Path(seen["pth_pkg"]).is_relative_to(image / "extra"), seen
    assert seen["pth_hook_pkg"] and Path(seen["pth_hook_pkg"]).is_relative_to(image / "hooked"), seen
    assert Path(seen["wheel_pkg"]).is_relative_to(venv) and seen["value"] == 42, seen
    assert Path(seen["rlpipe"]) == proj / "src" / "rlpipe" / "__init__.py", seen["rlpipe"]

    show = _run([str(venv / "bin" / "python"), "-m", "pip", "show", "rlpipe"], tmp_path, env)
    assert show.returncode == 0, show.stderr
    fields = dict(line.split(": ", 1) for line in show.stdout.splitlines() if ": " in line)
    assert fields.get("Editable project location") == str(proj), show.stdout
    assert Path(fields["Location"]).is_relative_to(venv), show.stdout
    assert _tree(base, image) == before, "the install wrote into the image"
