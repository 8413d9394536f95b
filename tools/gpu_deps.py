"""``make gpu-wheels`` and ``make gpu-deps``: what a GPU image with torch, triton and transformers
may lack, carried to it as wheels and installed there offline, then proven importable.

``make_wheels`` (run where a package index is reachable, with the project's environment) puts the
pure-Python packages of the trainer (hydra-core, omegaconf, antlr4-python3-runtime, whose 4.9.3
exists only as a source distribution and is built into a wheel here, datasets, huggingface-hub,
dill, multiprocess, xxhash, pandas) and of the tests (pytest and its own) into a git-ignored
folder of at most 64 MiB, at the versions of this environment, for the GPU box's Python only
(``GPU_BOX_PYTHON``; the folder's ``PYTHON`` file names it).

``install`` (stdlib only, no network) installs, with ``pip --no-index --no-deps --target``, the
wheels of the folder whose distributions the box's Python lacks, and those a ``pip check`` finds
too old for what is installed beside them; it never installs or replaces torch, triton or
transformers. Then ``verify`` imports every package the check needs and runs ``pip check``: a
package that does not import stops it with a one-line error.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

WHEELS_LIMIT_BYTES = 64 * 2**20
SOURCE_ONLY = {"antlr4-python3-runtime"}
"""Distributions published as a source distribution only (at the version hydra pins)."""
TRAINER_PACKAGES = (
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "datasets",
    "huggingface-hub",  # datasets needs a recent one; installed only where the box's is older
    "dill",
    "multiprocess",
    "xxhash",
    "pandas",  # datasets imports it; compiled, so only where the image lacks it
    "python-dateutil",
)
TEST_PACKAGES = ("pytest", "pluggy", "iniconfig", "pygments", "exceptiongroup", "tomli")
PER_PYTHON = {"multiprocess", "xxhash", "pandas", "exceptiongroup", "tomli"}
"""Wheels tagged per Python version (or needed by some versions only: exceptiongroup and tomli
serve Pythons before 3.11)."""
NEVER = {"torch", "triton", "transformers"}
"""The machine's own: never installed by the check, whatever the folder holds."""
BOX_PYTHON = "3.12"
"""The Python of the GPU boxes lent so far (``make gpu-wheels GPU_BOX_PYTHON=X.Y`` for another)."""
PLATFORMS = tuple(
    arg
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
    for arg in ("--platform", tag)
)
"""x86-64 Linux wheels (pip then takes the newest that fits one of these) or pure ones."""
REQUIRED = {"hydra-core", "omegaconf", "antlr4-python3-runtime", "datasets", "pytest"}
"""What the check cannot run without."""
IMPORTS = ("torch", "transformers", "hydra", "omegaconf", "datasets", "huggingface_hub", "pyarrow",
           "pytest")  # fmt: skip
"""Every package the check imports, proven importable after the install."""
REPORTED = ("huggingface-hub", "pyarrow", "datasets", "hydra-core")
"""The versions the report's header names beside torch's (what broke the first offline installs)."""


def pinned(name: str) -> str | None:
    """``name==version`` as installed here, or None when it is not installed."""
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return None


def pip(python: str, *args: str) -> None:
    subprocess.run([python, "-m", "pip", *args], check=True)


def download(dest: Path, spec: str, python_version: str | None) -> None:
    where = ["--python-version", python_version] if python_version else []
    pip(
        sys.executable, "download", "-q", "--no-deps", "--only-binary", ":all:", *PLATFORMS,
        *where, "-d", str(dest), spec,
    )  # fmt: skip


def make_wheels(dest: Path, box_python: str) -> None:
    """Fill ``dest`` with the wheels for a box running Python ``box_python`` (needs a package
    index); fails beyond the size limit."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in (*TRAINER_PACKAGES, *TEST_PACKAGES):
        spec = pinned(name) or name  # exceptiongroup, tomli: newest (this Python needs neither)
        if name in SOURCE_ONLY:
            pip(sys.executable, "wheel", "-q", "--no-deps", "--no-binary", name, "-w", str(dest),
                spec)  # fmt: skip
            continue
        try:
            download(dest, spec, box_python if name in PER_PYTHON else None)
        except subprocess.CalledProcessError:
            if name not in PER_PYTHON:
                raise
            print(f"{spec}: no wheel for Python {box_python}", file=sys.stderr)
    (dest / "PYTHON").write_text(box_python + "\n")
    size = sum(f.stat().st_size for f in dest.glob("*.whl"))
    print(f"{len(list(dest.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB in {dest}")
    if size > WHEELS_LIMIT_BYTES:
        sys.exit(
            f"error: {dest} holds {size / 2**20:.1f} MiB, over the 64 MiB a device run carries"
        )


def distribution_of(wheel: Path) -> str:
    """The normalised distribution name of a wheel file (``hydra_core-1.3.2-...`` -> hydra-core)."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def run_python(
    python: str, *args: str, path: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` (the box's Python), with ``path`` (the install target) first on its path."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    return subprocess.run([python, *args], capture_output=True, text=True, env=env)


def python_version(python: str) -> str:
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    return run_python(python, "-c", code).stdout.strip()


def missing(names: set[str], python: str) -> set[str]:
    """Those of ``names`` that ``python`` (the machine's, not this one) has no distribution of."""
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "found = set()\n"
        "for n in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        m.version(n); found.add(n)\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
        "print(json.dumps(sorted(found)))\n"
    )
    out = run_python(python, "-c", probe, json.dumps(sorted(names)))
    out.check_returncode()
    return names - set(json.loads(out.stdout))


def how_to_make(wheels: Path, version: str) -> str:
    return (
        f"make the folder where a package index is reachable with `make gpu-wheels "
        f"GPU_WHEELS={wheels} GPU_BOX_PYTHON={version}` and bring it along (make gpu-check "
        f"GPU_WHEELS=DIR reads another)"
    )


def check_folder_python(wheels: Path, version: str) -> None:
    """Stop when the folder's wheels were made for another Python than the box's."""
    made_for = wheels / "PYTHON"
    if made_for.is_file() and made_for.read_text().strip() != version:
        sys.exit(
            f"error: {wheels.resolve()} holds wheels for Python {made_for.read_text().strip()}, "
            f"this machine runs {version}: {how_to_make(wheels, version)}"
        )


def pip_check(python: str, target: Path | None = None) -> str:
    """``pip check`` of the box's site-packages (with the install target in front): its lines,
    or ``ok``."""
    done = run_python(python, "-m", "pip", "check", path=target)
    lines = (done.stdout + done.stderr).strip()
    return "ok" if done.returncode == 0 else lines


def conflicting(report: str) -> set[str]:
    """The distributions ``pip check`` finds too old or absent for what requires them."""
    names = re.findall(r"but you have (\S+) ", report)
    names += re.findall(r"requires (\S+), which is not installed", report)
    return {re.sub(r"[-_.]+", "-", n).lower() for n in names}


def install(wheels: Path, target: Path, python: str) -> None:
    """Install offline what ``python`` lacks among the folder's distributions into ``target``,
    and the folder's newer version of what ``pip check`` finds too old; then ``verify``."""
    version = python_version(python)
    available = {distribution_of(w) for w in wheels.glob("*.whl")} if wheels.is_dir() else set()
    available -= NEVER
    check_folder_python(wheels, version)
    unobtainable = missing(REQUIRED - available, python)
    if unobtainable:
        where = "has no wheel of them" if wheels.is_dir() else "does not exist"
        sys.exit(
            f"error: {python} lacks {', '.join(sorted(unobtainable))} and {wheels.resolve()} "
            f"{where}: {how_to_make(wheels, version)}"
        )
    needed = missing(available, python)
    if needed:
        print(f"gpu-deps: installing {', '.join(sorted(needed))} into {target} (offline)")
        pip_install(python, wheels, target, needed)
    stale = conflicting(pip_check(python, target)) & available - needed
    if stale:
        print(f"gpu-deps: {', '.join(sorted(stale))} too old here: the folder's, into {target}")
        pip_install(python, wheels, target, stale)
    if not needed | stale:
        print(f"gpu-deps: nothing to install (folder {wheels}: {len(available)} distributions)")
    verify(python, target)


def pip_install(python: str, wheels: Path, target: Path, names: set[str]) -> None:
    pip(
        python, "install", "-q", "--no-index", "--no-deps", "--find-links", str(wheels),
        "--target", str(target), "--upgrade", *sorted(names),
    )  # fmt: skip


def verify(python: str, target: Path) -> None:
    """Import every package the check needs, as the check will (``target`` first on the path),
    and print ``pip check``; a package that does not import stops here, not minutes later."""
    for module in IMPORTS:
        done = run_python(python, "-c", f"import {module}", path=target)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            sys.exit(f"error: after the offline install, {python} cannot import {module}: {last}")
    print(f"gpu-deps: {len(IMPORTS)} packages import; pip check: {pip_check(python, target)}")


def versions() -> dict[str, str]:
    """The versions the report names (this process runs with the install target on its path)."""
    return {name: (pinned(name) or f"{name} absent") for name in REPORTED}
