"""env.json: the machine, software and limits a set of results was measured on.

Collected without importing the heavy libraries it reports on (versions come from package
metadata; CUDA is looked for through the driver, and torch is asked only in a subprocess when
a driver is there).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from storebench.environments import describe_peers
from storebench.formats.manifest import package_versions

ENV_VERSION = 1
REPORTED_PACKAGES = (
    "numpy", "pillow", "simplejpeg", "h5py", "lmdb", "pyarrow", "pandas", "protobuf", "crc32c",
    "tensorflow-cpu", "tensorflow", "torch", "matplotlib", "psutil", "tqdm", "storebench",
)
# Documented top-level keys of env.json (tests hold the file to them).
ENV_KEYS = (
    "env_version", "utc_time", "profile", "cpu_model", "cpu_count", "cpus_usable", "ram_bytes",
    "kernel", "os", "python", "packages", "storage", "git", "cuda", "limits",
    "peers_environment",
)
# Keys that runs before they existed lack: read_env accepts an env.json without them.
LATER_ENV_KEYS = ("peers_environment",)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _unescape_mount(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount_of(path: Path | str) -> dict:
    """The /proc/mounts entry whose mount point is the longest prefix of ``path``."""
    target = os.path.realpath(path)
    best = {"mount_point": None, "fs_type": None, "source": None}
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        source, mount_point, fs_type = (_unescape_mount(p) for p in parts[:3])
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best["mount_point"] or ""):
            best = {"mount_point": mount_point, "fs_type": fs_type, "source": source}
    return best


def block_device_of(path: Path | str) -> dict:
    """The block device holding ``path`` (via st_dev -> /sys/dev/block) and its queue
    settings; the read-ahead of a partition is its whole disk's."""
    st_dev = os.stat(path).st_dev
    major, minor = os.major(st_dev), os.minor(st_dev)
    info = {"device": None, "dev": f"{major}:{minor}", "read_ahead_kb": None,
            "rotational": None, "scheduler": None}
    sys_path = Path(f"/sys/dev/block/{major}:{minor}")
    if not sys_path.exists():  # overlay, tmpfs, network filesystems: no block device
        return info
    device_dir = sys_path.resolve()
    info["device"] = device_dir.name
    queue = device_dir / "queue"
    if not queue.is_dir():
        queue = device_dir.parent / "queue"
    for key, name in (("read_ahead_kb", "read_ahead_kb"), ("rotational", "rotational"),
                      ("scheduler", "scheduler")):
        try:
            value = (queue / name).read_text().strip()
        except OSError:
            continue
        if "[" in value:  # "none [mq-deadline] kyber": the bracketed one is in use
            value = value.partition("[")[2].partition("]")[0]
        info[key] = int(value) if value.isdigit() else value
    return info


def storage_info(data_dir: Path | str) -> dict:
    path = Path(data_dir).resolve()
    while not path.exists():  # describe where the data will go even before it exists
        path = path.parent
    usage = shutil.disk_usage(path)
    return {
        "data_dir": str(Path(data_dir).resolve()),
        **mount_of(path),
        **block_device_of(path),
        "disk_total_bytes": usage.total,
        "disk_free_bytes": usage.free,
    }


def git_state(repo_dir: Path | str | None = None) -> dict:
    """Commit and dirty flag of the repository holding this code (None outside one)."""
    repo_dir = Path(repo_dir) if repo_dir else Path(__file__).resolve().parent
    state = {"commit": None, "dirty": None}
    if shutil.which("git") is None:
        return state

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(repo_dir), *args], capture_output=True,
                              text=True, timeout=30)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode == 0:
            state["commit"] = head.stdout.strip()
        status = git("status", "--porcelain", "--untracked-files=no")
        if status.returncode == 0:
            state["dirty"] = bool(status.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return state


def cuda_info(*, probe_timeout: float = 120.0) -> dict:
    """Whether an NVIDIA driver is present and, only then, what torch sees (in a subprocess,
    so that the caller does not import torch)."""
    driver_file = Path("/proc/driver/nvidia/version")
    driver = driver_file.exists() or shutil.which("nvidia-smi") is not None
    info = {"driver_present": driver, "driver_version": None, "torch_cuda_available": False,
            "device_count": 0, "devices": []}
    if not driver:
        return info
    with contextlib.suppress(OSError, IndexError):
        info["driver_version"] = driver_file.read_text().splitlines()[0].strip()
    probe = (
        "import json, torch\n"
        "ok = torch.cuda.is_available()\n"
        "n = torch.cuda.device_count() if ok else 0\n"
        "print(json.dumps({'ok': ok, 'n': n,"
        " 'names': [torch.cuda.get_device_name(i) for i in range(n)]}))\n"
    )
    try:
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                timeout=probe_timeout)
        found = json.loads(result.stdout.strip().splitlines()[-1])
        info.update(torch_cuda_available=found["ok"], device_count=found["n"],
                    devices=found["names"])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, KeyError):
        pass
    return info


def collect_env(data_dir: Path | str, *, profile: str | None = None,
                limits: dict | None = None, repo_dir: Path | str | None = None) -> dict:
    """Everything env.json holds; ``limits`` from ``limits.measure_limits`` in the same run."""
    uname = platform.uname()
    return {
        "env_version": ENV_VERSION,
        "utc_time": datetime.now(UTC).isoformat(timespec="seconds"),
        "profile": profile,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "ram_bytes": ram_bytes(),
        "kernel": uname.release,
        "os": f"{uname.system} {uname.version}",
        "python": platform.python_version(),
        "packages": package_versions(REPORTED_PACKAGES),
        "storage": storage_info(data_dir),
        "git": git_state(repo_dir),
        "cuda": cuda_info(),
        "limits": limits or {},
        # The second interpreter the peers study's cases run with (storebench.environments).
        "peers_environment": describe_peers(),
    }


def write_env(path: Path | str, env: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(env, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_env(path: Path | str) -> dict:
    path = Path(path)
    try:
        env = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read env.json: {err}") from err
    missing = [key for key in ENV_KEYS if key not in env and key not in LATER_ENV_KEYS]
    if missing:
        raise ValueError(f"{path}: env.json lacks {missing}")
    return env

