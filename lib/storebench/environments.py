"""The Python environments storebench runs in, and what each can import.

``main`` is the interpreter running storebench (``.venv``, what ``make`` builds). ``peers``
is ``.venv-peers``, also built by ``make``: the peer libraries (WebDataset, LitData,
MosaicML Streaming, DALI, FFCV, Lance, Zarr, torchdata) whose pins conflict with the main
environment (``mosaicml-streaming`` pins numpy<2.2) or which are too big to impose on every
user (DALI is ~1 GB). A case or a build that needs a peer library runs in a subprocess with
the peers interpreter; ``STOREBENCH_PEERS_PYTHON`` points at another one.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

MAIN, PEERS = "main", "peers"
ENVIRONMENTS = (MAIN, PEERS)
PEERS_PYTHON_ENV = "STOREBENCH_PEERS_PYTHON"
REPO_ROOT = Path(__file__).resolve().parents[2]
PEERS_VENV = REPO_ROOT / ".venv-peers"
# What is installed in the peers environment but does not work here, and why: recorded in
# the peers study's rows instead of being silently absent.
UNAVAILABLE_HERE = {
    "torchvision": (
        "torchvision 0.28.0, the only wheel pinned to torch 2.13.0, is a CUDA build whose "
        "import fails on this CPU-only torch (operator torchvision::nms does not exist); no "
        "CPU wheel is published"
    ),
}


class EnvironmentUnavailableError(RuntimeError):
    """An environment a case or build needs is not installed."""


def python_for(environment: str) -> Path:
    """The interpreter of ``environment`` ("" or ``main``: this one)."""
    if environment in ("", MAIN):
        return Path(sys.executable)
    if environment != PEERS:
        raise KeyError(f"unknown environment {environment!r}; known: {list(ENVIRONMENTS)}")
    configured = os.environ.get(PEERS_PYTHON_ENV)
    python = Path(configured) if configured else PEERS_VENV / "bin" / "python"
    if not python.exists():
        where = f"{PEERS_PYTHON_ENV}={configured}" if configured else str(python)
        raise EnvironmentUnavailableError(
            f"the peers environment is not installed ({where} does not exist); "
            "`make peers` creates it")
    return python


def missing_modules(modules) -> list[str]:
    """Those of ``modules`` (importable names) that this interpreter cannot find (a cheap
    check: nothing is imported)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            missing.append(name)
    return missing


def needs_text(modules, *, what: str) -> str | None:
    """None when every one of ``modules`` is importable here, else why ``what`` cannot run
    in this interpreter."""
    missing = missing_modules(modules)
    if not missing:
        return None
    return (f"{what} needs {', '.join(missing)}, not installed in {sys.executable}; the peers "
            "environment has it (`make peers`, then .venv-peers/bin/storebench)")


# The distributions whose versions a run records for the peers environment.
PEER_DISTRIBUTIONS = (
    "webdataset", "litdata", "mosaicml-streaming", "pylance", "zarr", "torchdata",
    "nvidia-dali-cuda120", "ffcv", "spdl", "numba", "numpy", "torch", "torchvision", "simplejpeg",
)


def describe_peers(*, timeout_s: float = 60.0) -> dict:
    """What env.json records of the peers environment: its interpreter and the versions of
    ``PEER_DISTRIBUTIONS`` there (None: not installed), or why it is unavailable."""
    import json
    import subprocess

    try:
        python = python_for(PEERS)
    except EnvironmentUnavailableError as err:
        return {"unavailable": str(err)}
    script = (
        "import json, platform, sys\n"
        "from importlib import metadata\n"
        "def version(name):\n"
        "    try:\n"
        "        return metadata.version(name)\n"
        "    except metadata.PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({'python': platform.python_version(),\n"
        "                  'packages': {n: version(n) for n in sys.argv[1:]}}))\n"
    )
    try:
        completed = subprocess.run([str(python), "-c", script, *PEER_DISTRIBUTIONS],
                                   capture_output=True, text=True, timeout=timeout_s,
                                   check=True)
        described = json.loads(completed.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        return {"unavailable": f"{python} could not report its packages: {err}"}
    return {"interpreter": str(python), **described,
            "unavailable_here": dict(UNAVAILABLE_HERE)}
