"""The sets in the peer libraries' formats, built with the peers environment's interpreter:
what the peers and resume studies prepare before their grids are laid out."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..bench.plan import data_dir_family


def build_peer_formats(*, profile: str, data_dir: Path | str, formats: tuple[str, ...],
                       progress: bool = True, jobs: int | None = None) -> None:
    """Build ``formats`` with the peers environment's interpreter (where it is missing the
    grid's rows say so): the raw and JPEG sets of ``data_dir``'s family, cut
    (``bench.plan.peer_specs``), in each of ``formats`` that holds them, in the peer sets'
    directory (``storebench build --peer-sets``). The formats are split among ``jobs``
    processes (default: one per core, at most two), each building both sets of its formats:
    importing the peer libraries, not writing the samples, is most of a small build, and
    nothing is measured meanwhile. A failed build is reported, not fatal: its rows become
    ``skipped``."""
    import os
    import sys

    from ..environments import EnvironmentUnavailableError, python_for

    if not formats:
        return
    try:
        python = python_for("peers")
    except EnvironmentUnavailableError as err:
        print(f"storebench: peers study: {err}", file=sys.stderr)
        return
    family = data_dir_family(data_dir)
    jobs = max(1, min(jobs or min(2, os.cpu_count() or 1), len(formats)))
    processes = []
    try:
        for share in range(jobs):
            command = [str(python), "-m", "storebench", "build", "--profile", profile,
                       "--out", str(data_dir), "--peer-sets", "--family", family,
                       "--formats", *formats[share::jobs]]
            processes.append(subprocess.Popen(command + ([] if progress else ["--quiet"])))
        failed = [(formats[share::jobs], process.wait())
                  for share, process in enumerate(processes)]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for names, returncode in failed:
        if returncode:
            print(f"storebench: peers study: building {', '.join(names)} failed "
                  f"({returncode}); their rows will be skipped", file=sys.stderr)
