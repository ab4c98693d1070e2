"""The gpu_decode study in one command, for a GPU machine used for minutes:
``make gpu-study`` runs ``python -m storebench.gpu_study``. It sits above the studies
(it records the environment as ``storebench.study`` does), beside the command line.

1. Installs what the machine lacks, with pip into the running environment: simplejpeg, lmdb
   and crc32c everywhere, and where an NVIDIA driver is present nvImageCodec and DALI for
   torch's CUDA major version (``--wheels DIR``: from wheel files carried there, without an
   index). A package that will not install is reported and its cases are skipped rows.
2. Builds the study's set only (``grid.prepare``: 2,048 JPEGs of 375x500 in LMDB on the
   default plan), not a profile's formats.
3. Runs the ResNet-50 demand and the decode-on-device cases, then the CPU cores curve at the
   model's measured rate (the emulated one where none was measured), into
   ``<runs>/<run id>/gpu_decode.csv`` with ``env.json`` beside it, and draws the study's
   figures into ``figures/``.

Without a device every device case is a skipped row giving the reason, the cores curve runs
on this machine's cores against the emulated demand, and the command still exits 0.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CPU_PACKAGES = (("simplejpeg", ("simplejpeg",)), ("lmdb", ("lmdb",)), ("crc32c", ("crc32c",)))


def driver_present() -> bool:
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def cuda_major() -> int | None:
    """torch's CUDA major version where an NVIDIA driver is present, else None."""
    if not driver_present():
        return None
    try:
        import torch
    except ImportError:
        return None
    version = torch.version.cuda
    return int(version.split(".")[0]) if version else None


def wanted_packages(major: int | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(module, distributions that provide it) the study imports: the CPU decoder and the
    LMDB set's libraries, and with a CUDA major version the device decoders built for it
    (nvImageCodec with the nvJPEG it loads, DALI)."""
    if major is None:
        return CPU_PACKAGES
    nvjpeg = "nvidia-nvjpeg" if major >= 13 else f"nvidia-nvjpeg-cu{major}"
    return (*CPU_PACKAGES,
            ("nvidia.nvimgcodec", (f"nvidia-nvimgcodec-cu{major}", nvjpeg)),
            ("nvidia.dali", (f"nvidia-dali-cuda{major}0",)))


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package that is not there
        return False


def pip_command(distributions: Sequence[str], *, wheels: Path | None,
                python: str = sys.executable) -> list[str]:
    """pip installing ``distributions`` (and what they require) into the running
    environment: from the wheel files in ``wheels`` only where that directory is given."""
    source = ["--no-index", "--find-links", str(wheels)] if wheels is not None else []
    # A machine that reaches no index fails at once rather than after pip's retries.
    return [python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
            "--retries", "0", "--timeout", "10", *source, *distributions]


def install_missing(wanted, *, wheels: Path | None, run=subprocess.run) -> dict[str, str]:
    """Install the distributions of every module of ``wanted`` that does not import, one
    module at a time; module -> "installed", "present" or why it is not."""
    report = {}
    for module, distributions in wanted:
        if importable(module):
            report[module] = "present"
            continue
        done = run(pip_command(distributions, wheels=wheels), capture_output=True, text=True)
        importlib.invalidate_caches()
        if done.returncode == 0 and importable(module):
            report[module] = "installed"
        else:
            tail = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no output"]
            report[module] = f"not installed ({' '.join(distributions)}): {tail[0]}"
    return report


def nvidia_library_dirs(paths: Sequence[str] = tuple(sys.path)) -> list[str]:
    """The ``nvidia/cu*/lib`` folders the CUDA wheels installed (nvJPEG among them): the
    case processes' loader path, since nvImageCodec opens libnvjpeg by name."""
    return sorted({str(lib) for entry in paths if entry and Path(entry).is_dir()
                   for lib in Path(entry).glob("nvidia/cu*/lib") if lib.is_dir()})


def run(*, runs: Path, data_dir: Path, profile: str, repeats: int | None,
        progress: bool) -> Path:
    """Steps 2 and 3 of the module docstring; the run's directory."""
    from .bench.plan import case_timeout_s
    from .bench.runner import new_run_id, run_cases
    from .plots import save_figure
    from .results import Results
    from .studies.gpu_decode import grid, report, study
    from .study import record_environment

    run_id = new_run_id()
    out = runs / run_id
    grid.prepare(profile=profile, data_dir=data_dir, progress=progress)
    record_environment(profile, data_dir, out, run_id=run_id)
    rows = out / f"{grid.NAME}.csv"
    common = {"profile": profile, "run_id": run_id, "timeout_s": case_timeout_s(profile),
              "progress": progress}
    run_cases(grid.grid(profile=profile, data_dir=data_dir, repeats=repeats,
                         families=("demand", "device")), rows, **common)
    demand = report.model_demand(Results.load(out).df)
    run_cases(grid.grid(profile=profile, data_dir=data_dir, repeats=repeats, families=("cpu",),
                         demand_samples_per_s=demand,
                         demand_source="resnet50" if demand else None), rows, **common)
    results = Results.load(out)
    for spec in study.STUDY.figures:
        save_figure(spec.draw(results), out / "figures" / spec.name)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m storebench.gpu_study",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("results/gpu-runs"),
                        help="the run goes to RUNS/<run id>/")
    parser.add_argument("--data", type=Path, default=Path("/tmp/storebench-gpu-data"),
                        help="where the study's set is built (DATA/<profile>/gpu_decode)")
    parser.add_argument("--profile", default="small", help="the plan: ci is quick")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--wheels", type=Path, default=None,
                        help="install missing packages from the wheel files here, no index")
    parser.add_argument("--no-install", action="store_true", help="install nothing")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    wheels = args.wheels if args.wheels is not None and args.wheels.is_dir() else None
    if not args.no_install:
        for module, state in install_missing(wanted_packages(cuda_major()),
                                             wheels=wheels).items():
            print(f"gpu-study: {module}: {state}", flush=True)
    if not driver_present():
        print("gpu-study: no NVIDIA driver here: every device case is a skipped row, and the "
              "cores curve feeds an emulated accelerator", flush=True)
    found = nvidia_library_dirs()
    if found:  # the case workers start after this and inherit it
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            [*found, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])
    out = run(runs=args.runs, data_dir=args.data / args.profile, profile=args.profile,
              repeats=args.repeats, progress=not args.quiet)
    from .results import Results
    from .studies.gpu_decode import report

    results = Results.load(out)
    print(f"gpu-study: wrote {out}", flush=True)
    for sentence in report.findings(results):
        print(f"- {sentence}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
