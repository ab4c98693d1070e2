"""Helpers for hostile-input tests: reseal an edited dataset as its sender could, and run a
storebench command in a child bounded in time and memory."""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from storebench.formats.manifest import (
    MANIFEST_NAME,
    file_fingerprint,
    fingerprint_span,
    manifest_digest,
)

PROBE_MEMORY_BYTES = 2 << 30
PROBE_TIMEOUT_S = 120


def copy_dataset(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    return dest


def edit_manifest(root: Path, edit) -> dict:
    """Apply ``edit(manifest)`` and recompute the manifest's digest: it is unkeyed, so
    whoever hands a dataset over can."""
    path = root / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    edit(manifest)
    manifest["manifest_digest"] = manifest_digest(manifest)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def reseal(root: Path) -> dict:
    """Recompute every listed file's size and fingerprint and the digest, after the files
    were changed on purpose (a crafted file then passes every identity check)."""

    def edit(manifest: dict) -> None:
        for rel, old in manifest["fingerprints"].items():
            if not stat.S_ISREG(os.stat(root / rel).st_mode):  # a FIFO, a device: empty
                manifest["files"][rel] = 0
                manifest["fingerprints"][rel] = {"head": 0, "tail": 0, "crc32c": 0}
                continue
            size = os.stat(root / rel).st_size
            whole = old["head"] == manifest["files"][rel] and old["tail"] == 0
            head, tail = (size, 0) if whole else fingerprint_span(size)
            manifest["files"][rel] = size
            manifest["fingerprints"][rel] = {
                "head": head, "tail": tail, "crc32c": file_fingerprint(root / rel, head, tail)}

    return edit_manifest(root, edit)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (PROBE_MEMORY_BYTES, PROBE_MEMORY_BYTES))


def bounded(args: list[str], *, timeout_s: float = PROBE_TIMEOUT_S, cwd=None,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m storebench ARGS`` in a child with a memory limit and a time limit: a
    hang fails the test, it does not hang the suite; an allocation past the limit is a
    MemoryError in the child, not the machine swapping."""
    try:
        return subprocess.run([sys.executable, "-m", "storebench", *args], cwd=cwd,
                              capture_output=True, text=True, timeout=timeout_s,
                              preexec_fn=_limit_memory, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"storebench {' '.join(args)}: still running after {timeout_s} s (hang)")


def python_bounded(code: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``python -c CODE`` bounded as ``bounded`` bounds a command."""
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout_s, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"probe still running after {timeout_s} s (hang):\n{code}")


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit code 2 (or 1 for a failed verify), no traceback, and the message names what
    it must."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (1, 2), (result.returncode, result.stdout, result.stderr)
    text = result.stdout + result.stderr
    for needle in needles:
        assert needle in text, (needle, text)
