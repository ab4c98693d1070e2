"""The command line, end to end on the ci profile (real processes, real files)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

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
    """Every core format by default; the peer formats are the peers study's to build."""
    out, stdout = built
    expected = {
        f"{name}-{enc}"
        for name, m in FORMATS.items()
        for enc in ("raw", "png", "jpeg")
        if enc in m.ENCODINGS and name in FORMATS.core
    }
    assert {p.name for p in out.iterdir()} == expected
    assert "skip   memmap-png" in stdout
    for name in expected:
        manifest = json.loads((out / name / "manifest.json").read_text())
        assert manifest["bytes_allocated"] > 0 and manifest["write_seconds"] >= 0


def test_build_samples_writes_the_first_samples_of_each_set(built, tmp_path):
    """``--samples N``: the set's first N samples, byte for byte the whole build's."""
    import numpy as np

    from storebench.formats import open_dataset

    whole_dir, _ = built
    result = storebench("build", "--profile", "ci", "--out", str(tmp_path), "--quiet",
                        "--formats", "memmap", "--encodings", "raw", "--samples", "100")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "memmap-raw" / "manifest.json").read_text())[
        "num_samples"] == 100
    with open_dataset(tmp_path / "memmap-raw") as cut, \
            open_dataset(whole_dir / "memmap-raw") as whole:
        assert len(cut) == 100 and len(whole) == 512
        for index in (0, 57, 99):
            (a, label_a), (b, label_b) = cut[index], whole[index]
            assert label_a == label_b and np.array_equal(a, b)
    refused = storebench("build", "--profile", "ci", "--out", str(tmp_path), "--quiet",
                         "--formats", "memmap", "--samples", "0")
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith("samples must be positive, got 0")
    # A cut build never silently replaces the whole set's build at the same place.
    before = (whole_dir / "memmap-raw" / "manifest.json").read_bytes()
    replacing = storebench("build", "--profile", "ci", "--out", str(whole_dir), "--quiet",
                           "--formats", "memmap", "--encodings", "raw", "--samples", "100")
    assert replacing.returncode == 2
    assert replacing.stderr.strip().endswith(
        "memmap-raw: holds a build of 512 samples; a build of its first 100 would replace "
        "it: choose another --out, or pass --force")
    assert (whole_dir / "memmap-raw" / "manifest.json").read_bytes() == before
    # A set cut to another count is no whole set: rebuilt at the new count, as any spec is.
    recut = storebench("build", "--profile", "ci", "--out", str(tmp_path), "--quiet",
                       "--formats", "memmap", "--encodings", "raw", "--samples", "50")
    assert recut.returncode == 0, recut.stderr
    assert json.loads((tmp_path / "memmap-raw" / "manifest.json").read_text())[
        "num_samples"] == 50


def test_build_peer_sets_writes_both_sets_cut_to_one_count_apart(built, tmp_path):
    """``--peer-sets``: the peers study's sets, raw and JPEG cut to one count (256: the ci
    JPEG set's, of the raw set's 512), in OUT/peers."""
    import numpy as np

    from storebench.formats import open_dataset

    whole_dir, _ = built
    result = storebench("build", "--profile", "ci", "--out", str(tmp_path), "--quiet",
                        "--peer-sets", "--formats", "memmap", "lmdb")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["peers"]
    assert sorted(p.name for p in (tmp_path / "peers").iterdir()) == [
        "lmdb-jpeg", "lmdb-raw", "memmap-raw"]
    assert "skip   memmap-jpeg" in result.stdout
    for encoding in ("raw", "jpeg"):
        with open_dataset(tmp_path / "peers" / f"lmdb-{encoding}") as cut, \
                open_dataset(whole_dir / f"lmdb-{encoding}") as whole:
            assert len(cut) == 256
            (a, label_a), (b, label_b) = cut[255], whole[255]
            assert label_a == label_b and (a == b if isinstance(a, bytes)
                                           else np.array_equal(a, b))
    refused = storebench("build", "--profile", "ci", "--out", str(tmp_path), "--quiet",
                         "--peer-sets", "--encodings", "raw")
    assert refused.returncode == 2
    assert "takes neither --encodings nor --samples" in refused.stderr


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
    # A byte inside sample 300 (the .npy header is 128 bytes; 32x32x3 bytes per sample),
    # away from the head and tail that the open-time fingerprint covers.
    data[128 + 300 * 3072 + 5] ^= 0xFF
    images.write_bytes(bytes(data))
    result = storebench("verify", str(victim), "--quiet")
    assert result.returncode == 1
    assert result.stdout.startswith("FAIL") and "images.npy: sample 300" in result.stdout


def test_bad_arguments_give_clear_errors(tmp_path):
    result = storebench("build", "--profile", "ci", "--out", str(tmp_path), "--formats", "n5")
    assert result.returncode == 2 and "unknown format 'n5'" in result.stderr
    result = storebench("verify", str(tmp_path / "missing"))
    assert result.returncode == 2 and "no such directory" in result.stderr
    result = storebench("verify", str(tmp_path))
    assert result.returncode == 2 and "no dataset" in result.stderr


def test_python_dash_m_storebench_and_version():
    result = subprocess.run([sys.executable, "-m", "storebench", "--version"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert re.fullmatch(r"storebench \d+\.\d+\.\d+\S*\n", result.stdout), result.stdout


def test_user_errors_are_one_line_and_exit_2(tmp_path):
    result = storebench("findings", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    missing = tmp_path / "nowhere"
    assert result.stderr == f"storebench findings: {missing}: no such results directory\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    result = storebench("findings", str(empty))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "no results (*.csv, *.csv.gz)" in result.stderr
    # An --out that is a file, and one in a read-only directory: one line, no traceback.
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    result = storebench("build", "--profile", "ci", "--out", str(a_file), "--quiet",
                        "--formats", "memmap", "--encodings", "raw")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and str(a_file) in result.stderr
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        result = storebench("build", "--profile", "ci", "--out", str(read_only / "d"),
                            "--quiet", "--formats", "memmap", "--encodings", "raw")
    finally:
        read_only.chmod(0o700)
    if os.geteuid() != 0:  # root writes anywhere: only an ordinary user is refused
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("command", ["run", "study"])
def test_a_profile_folder_given_as_the_data_root_is_refused_before_any_build(built, tmp_path,
                                                                            command):
    out, _ = built  # the ci sets, right under ``out``: a profile's folder, not a data root
    study = ("--study", "formats") if command == "run" else ("--no-notebooks",)
    result = storebench(command, *study, "--profile", "ci", "--data", str(out), "--results",
                        str(tmp_path / "results"), "--quiet")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    first = sorted(path.parent.name for path in out.glob("*/manifest.json"))[0]
    assert result.stderr == (
        f"storebench {command}: {out} holds the ci profile's datasets itself ({first}, ...), "
        "not a folder per profile: --data is the root that holds ci/\n")
    assert not (out / "ci").exists()


def test_a_data_root_beside_datasets_of_another_profile_is_not_refused(built, tmp_path):
    from storebench.study import data_dir_for

    out, _ = built  # the ci sets: not the small profile's
    assert data_dir_for("small", out) == out / "small"
    with pytest.raises(ValueError, match="holds the ci profile's datasets itself"):
        data_dir_for("ci", out)


def test_findings_prints_the_guide_and_json_lists_the_candidates():
    reference = Path(__file__).resolve().parents[1] / "results" / "reference"
    if not (reference / "env.json").exists():
        pytest.skip("no committed reference results")
    text = storebench("findings", str(reference))
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("Measured on: ") and "Tie rule:" in text.stdout
    rows = json.loads(storebench("findings", str(reference), "--json").stdout)
    assert rows and all(row["candidates"] for row in rows)
    for row in rows:
        medians = [c["median"] for c in row["candidates"]]
        ordered = sorted(medians, reverse=not row["lower_is_better"])
        assert medians == ordered, row["question"]
        assert row["best"] == row["candidates"][0]["key"]
        assert row["choice"].startswith("equivalent within") == (
            row["tie"] and not row["undecided"])
        assert row["choice"].startswith("undecided between") == row["undecided"]


def test_building_a_peer_format_without_its_library_says_where_it_is(tmp_path):
    """In the main environment a peer format is skipped with the reason, not an error."""
    from storebench.formats import unavailable_reason

    if unavailable_reason("lance") is None:
        pytest.skip("this interpreter has lance")
    result = storebench("build", "--profile", "ci", "--out", str(tmp_path), "--formats",
                        "lance", "memmap", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "skip   lance: format 'lance' needs lance, not installed in" in result.stdout
    assert "make peers" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memmap-raw"]
