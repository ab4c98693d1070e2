"""The command line, end to end on the ci profile (real processes, real files)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from storebench.formats import FORMATS


def storebench(*args, check=False):
    return subprocess.run(
        [sys.executable, "-m", "storebench.cli", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=600,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli-build")
    result = storebench("build", "--profile", "ci", "--out", str(out), "--quiet", "--workers", "2")
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_build_writes_every_format_and_encoding(built):
    out, stdout = built
    expected = {
        f"{name}-{enc}"
        for name, m in FORMATS.items()
        for enc in ("raw", "png", "jpeg")
        if enc in m.ENCODINGS
    }
    assert {p.name for p in out.iterdir()} == expected
    assert "skip   memmap-png" in stdout
    for name in expected:
        manifest = json.loads((out / name / "manifest.json").read_text())
        assert manifest["bytes_allocated"] > 0 and manifest["write_seconds"] >= 0


def test_rebuild_is_skipped_and_verify_passes(built):
    out, _ = built
    again = storebench(
        "build",
        "--profile",
        "ci",
        "--out",
        str(out),
        "--quiet",
        "--formats",
        "hdf5",
        "--encodings",
        "raw",
    )
    assert again.returncode == 0 and again.stdout.startswith("exists ")
    result = storebench("verify", str(out), "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == len(list(out.iterdir()))
    assert all(line.startswith("OK   ") for line in lines)


def test_verify_fails_on_a_damaged_dataset(built, tmp_path):
    import shutil

    out, _ = built
    victim = tmp_path / "memmap-raw"
    shutil.copytree(out / "memmap-raw", victim)
    images = victim / "images.npy"
    data = bytearray(images.read_bytes())
    data[-100] ^= 0xFF
    images.write_bytes(bytes(data))
    result = storebench("verify", str(victim), "--quiet")
    assert result.returncode == 1
    assert result.stdout.startswith("FAIL") and "images.npy: sample 511" in result.stdout


def test_bad_arguments_give_clear_errors(tmp_path):
    result = storebench("build", "--profile", "ci", "--out", str(tmp_path), "--formats", "zarr")
    assert result.returncode == 2 and "unknown format 'zarr'" in result.stderr
    result = storebench("verify", str(tmp_path / "missing"))
    assert result.returncode == 2 and "no such directory" in result.stderr
    result = storebench("verify", str(tmp_path))
    assert result.returncode == 2 and "no dataset" in result.stderr
