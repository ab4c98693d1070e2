"""The rate of ``storebench import`` by engine and core count: each run is the CLI in its own
process tree pinned to the first N CPUs this process may use (``taskset``), Ray's raylet,
GCS and workers included, into a fresh output folder that is removed afterwards.

    python -m storebench.import_bench SRC --results FILE.csv [--cores 1 2] [--repeats 3]
        [--engines process ray] [--resize 224x224] [--formats parquet ...]

Each run appends one long-form row to FILE.csv (``COLUMNS``). ``wall_s`` is the whole
command's wall time, the engine's start included (Ray's start is part of what a user waits
for); a failed run is a row with ``status`` "failed" and the last line it printed.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from .formats.base import DatasetError
from .importer import IMPORT_ENGINES, scan_source

COLUMNS = ("created_utc", "source", "images", "source_bytes", "engine", "cores", "repeat",
           "formats", "resize", "status", "wall_s", "images_per_s", "detail")


def import_command(source: Path, out: Path, *, engine: str, cores: int,
                   formats: list[str] | None, resize: str | None) -> list[str]:
    command = [sys.executable, "-m", "storebench", "import", str(source), "--out", str(out),
               "--engine", engine, "--workers", str(cores), "--quiet"]
    if formats:
        command += ["--formats", *formats]
    if resize:
        command += ["--resize", resize]
    return command


def run_once(source: Path, work: Path, *, engine: str, cores: int, formats: list[str] | None,
             resize: str | None) -> tuple[str, float, str]:
    """``(status, wall_s, detail)`` of one import pinned to ``cores`` CPUs."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < cores:
        return "skipped", float("nan"), f"{cores} cores asked, {len(allowed)} available"
    if shutil.which("taskset") is None:
        return "skipped", float("nan"), "taskset (util-linux) is not installed"
    out = Path(tempfile.mkdtemp(prefix=f"{engine}-{cores}-", dir=work))
    pinned = ["taskset", "--cpu-list", ",".join(map(str, allowed[:cores]))]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray only
    started = time.perf_counter()
    done = subprocess.run([*pinned, *import_command(source, out, engine=engine, cores=cores,
                                                    formats=formats, resize=resize)],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return "failed", wall, last[0]
    return "ok", wall, ""


def append_rows(path: Path, rows: list[dict]) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m storebench.import_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", type=Path)
    p.add_argument("--results", type=Path, required=True, help="the CSV file rows go to")
    p.add_argument("--engines", nargs="+", choices=sorted(IMPORT_ENGINES),
                   default=sorted(IMPORT_ENGINES))
    p.add_argument("--cores", nargs="+", type=int, default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--formats", nargs="+")
    p.add_argument("--resize", metavar="HxW")
    args = p.parse_args(argv)
    try:
        listing = scan_source(args.source)
    except DatasetError as err:
        print(f"storebench import_bench: {err}", file=sys.stderr)
        return 2
    source_bytes = sum((listing.root / rel).stat().st_size for rel in listing.paths)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    # Scratch outputs beside the results (not in the source folder), removed at the end.
    with tempfile.TemporaryDirectory(prefix=".import-bench-", dir=args.results.parent) as work:
        for repeat in range(args.repeats):
            for cores in args.cores:
                for engine in args.engines:
                    status, wall, detail = run_once(args.source, Path(work), engine=engine,
                                                    cores=cores, formats=args.formats,
                                                    resize=args.resize)
                    row = {
                        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
                        "source": str(listing.origin), "images": len(listing),
                        "source_bytes": source_bytes, "engine": engine, "cores": cores,
                        "repeat": repeat, "formats": " ".join(args.formats or ["core"]),
                        "resize": args.resize or "", "status": status,
                        "wall_s": round(wall, 3),
                        "images_per_s": round(len(listing) / wall, 2) if status == "ok"
                        else "",
                        "detail": detail,
                    }
                    append_rows(args.results, [row])
                    print(f"{engine:8s} {cores} core(s) repeat {repeat}: {status} "
                          f"{wall:.1f} s {detail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
