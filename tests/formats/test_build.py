"""Atomic builds: skipped when current, replayable from one generation, nothing valid-looking
left by a failed or killed build."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import data_gen
from storebench.formats import FORMATS, build_dataset, open_dataset, read_manifest
from storebench.formats.build import TMP_PREFIX, SampleCache

SPECS = [
    data_gen.DatasetSpec(40, 16, 16, encoding="raw", seed=4),
    data_gen.DatasetSpec(30, 16, 16, encoding="jpeg", seed=5),
]


@pytest.mark.parametrize("spec", SPECS, ids=["raw", "jpeg"])
def test_builds_from_one_sample_cache_equal_direct_builds(tmp_path, spec):
    direct = build_dataset(spec, "hdf5", tmp_path / "direct", workers=1)
    with SampleCache(spec, tmp_path / "cached", workers=1) as cache:
        first = build_dataset(spec, "hdf5", tmp_path / "cached", source=cache)
        second = build_dataset(spec, "lmdb", tmp_path / "cached", source=cache)
        assert cache.dir.is_dir()
    assert not cache.dir.exists()
    assert first.manifest["digest"] == direct.manifest["digest"] == second.manifest["digest"]
    with open_dataset(second.path) as reader:
        image, label = reader[len(reader) - 1]
        want_image, want_label = data_gen.sample(spec, len(reader) - 1)
        assert np.array_equal(np.asarray(image), np.asarray(want_image)) or image == want_image
        assert label == want_label


@pytest.mark.parametrize(("format_name", "spec"), [
    pytest.param(name, spec, id=f"{name}-{spec.encoding}") for name in FORMATS.core
    for spec in SPECS if spec.encoding in FORMATS[name].ENCODINGS])
def test_two_builds_of_one_spec_are_the_same_bytes(tmp_path, format_name, spec):
    """A build is a function of its spec: every file but the manifest (which records when
    and how fast it was written) is the same bytes, built a second apart."""
    built = []
    for name in ("first", "second"):
        path = build_dataset(spec, format_name, tmp_path / name, workers=1).path
        built.append({p.relative_to(path).as_posix(): p.read_bytes()
                      for p in sorted(path.rglob("*")) if p.is_file()
                      and p.name != "manifest.json"})
        time.sleep(1.1)  # timestamps, where a writer records them, then differ
    assert sorted(built[0]) == sorted(built[1])
    assert [name for name in built[0] if built[0][name] != built[1][name]] == []


def test_cache_of_another_spec_is_refused(tmp_path):
    with SampleCache(SPECS[0], tmp_path) as cache, pytest.raises(ValueError, match="another spec"):
        build_dataset(SPECS[1], "hdf5", tmp_path, source=cache)


def test_matching_build_is_skipped_and_changed_knobs_rebuild(tmp_path):
    spec = SPECS[0]
    built = build_dataset(spec, "hdf5", tmp_path, workers=1)
    again = build_dataset(spec, "hdf5", tmp_path, workers=1)
    assert not built.skipped and again.skipped
    assert again.manifest["created_utc"] == built.manifest["created_utc"]
    rebuilt = build_dataset(spec, "hdf5", tmp_path, workers=1, knobs={"chunk_samples": 8})
    assert not rebuilt.skipped and read_manifest(rebuilt.path)["knobs"]["chunk_samples"] == 8
    assert [p.name for p in tmp_path.iterdir()] == ["hdf5-raw"]


def test_failing_source_leaves_nothing(tmp_path):
    spec = SPECS[0]

    class Boom(SampleCache):
        def __iter__(self):
            for k, item in enumerate(super().__iter__()):
                if k == 10:
                    raise RuntimeError("generator died")
                yield item

    with Boom(spec, tmp_path / "scratch", workers=1) as cache, pytest.raises(RuntimeError):
        build_dataset(spec, "memmap", tmp_path / "out", source=cache)
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.timeout(120)
def test_killed_build_leaves_no_manifest_and_is_cleaned_up(tmp_path):
    # Far more samples than are written before the kill, on a machine of any speed.
    spec = data_gen.DatasetSpec(400_000, 64, 64, encoding="png", seed=9)
    code = (
        "import data_gen, sys\n"
        "from storebench.formats import build_dataset\n"
        f"spec = data_gen.DatasetSpec(**{spec.to_dict()!r})\n"
        "if __name__ == '__main__':\n"
        f"    build_dataset(spec, 'rawfiles', {str(tmp_path)!r}, workers=1)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 60
    # Killed once it has written samples into its temporary directory.
    while not any(p.name.startswith(TMP_PREFIX) and any(p.rglob("*.png"))
                  for p in tmp_path.iterdir()):
        assert time.monotonic() < deadline and child.poll() is None, "build never started"
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    leftovers = list(tmp_path.iterdir())
    assert leftovers and all(p.name.startswith(TMP_PREFIX) for p in leftovers)
    assert not list(tmp_path.rglob("manifest.json"))
    small = data_gen.DatasetSpec(8, 8, 8, encoding="png")
    build_dataset(small, "hdf5", tmp_path, workers=1)  # a later build sweeps the dead one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hdf5-png"]


def test_manifest_records_fingerprints_and_integrity(tmp_path):
    from storebench.formats.base import crc32c_of_ints
    from storebench.formats.manifest import file_fingerprint

    spec = SPECS[1]
    built = build_dataset(spec, "tfrecord", tmp_path, workers=1)
    manifest = built.manifest
    assert set(manifest["fingerprints"]) == set(manifest["files"])
    for rel, recorded in manifest["fingerprints"].items():
        size = manifest["files"][rel]
        if rel.endswith((".index", ".idx")):
            assert (recorded["head"], recorded["tail"]) == (size, 0)  # indexes: the whole file
        else:
            assert (recorded["head"], recorded["tail"]) == (4096, min(4096, size - 4096))
        path = built.path / rel
        assert recorded["crc32c"] == file_fingerprint(path, recorded["head"], recorded["tail"])
    samples = [data_gen.sample(spec, i) for i in range(spec.num_samples)]
    assert manifest["integrity"] == {
        "labels_crc32c": crc32c_of_ints(np.array([label for _, label in samples])),
        "sizes_crc32c": crc32c_of_ints(np.array([len(image) for image, _ in samples])),
    }


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MiB tmpfs: small enough to fill with a ci-sized build."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
        capture_output=True, text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


FULL_DISK_SPECS = {
    "raw": data_gen.DatasetSpec(240, 64, 64, encoding="raw", seed=4),  # 2.9 MB of pixels
    "png": data_gen.DatasetSpec(600, 64, 64, encoding="png", seed=5),  # ~4 MB of PNG
}
FULL_DISK_CASES = [
    (name, encoding)
    for name in ("hdf5", "lmdb", "memmap", "parquet", "rawfiles", "tfrecord")
    for encoding in FULL_DISK_SPECS
    if not (name == "memmap" and encoding == "png")
]


@pytest.mark.parametrize(("format_name", "encoding"), FULL_DISK_CASES)
def test_build_that_cannot_fit_is_refused_before_writing(tiny_disk, format_name, encoding):
    from storebench.formats import DatasetError

    with pytest.raises(DatasetError, match=f"{tiny_disk}: {format_name}-{encoding} needs about"):
        build_dataset(FULL_DISK_SPECS[encoding], format_name, tiny_disk, workers=1)
    assert list(tiny_disk.iterdir()) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("format_name", "encoding"), FULL_DISK_CASES)
def test_disk_full_during_a_build_is_a_dataset_error_and_leaves_nothing(
    tiny_disk, monkeypatch, format_name, encoding
):
    """Past the free-space estimate (disabled here), a full disk ends the build with a
    DatasetError naming the dataset, not SIGBUS, a segfault or a bare OSError, and the partial
    .tmp-* directory is gone, so the disk is free again."""
    import shutil

    from storebench.formats import DatasetError, build

    monkeypatch.setattr(build, "estimate_bytes", lambda spec, module=None: 0)
    with pytest.raises(DatasetError, match=f"{tiny_disk / f'{format_name}-{encoding}'}: build "
                                           "failed, the partial .tmp-.* was removed"):
        build_dataset(FULL_DISK_SPECS[encoding], format_name, tiny_disk, workers=1)
    assert list(tiny_disk.iterdir()) == []
    assert shutil.disk_usage(tiny_disk).used < 64 << 10


def test_sample_cache_on_a_full_disk_is_a_dataset_error(tiny_disk, monkeypatch):
    from storebench.formats import DatasetError, build

    monkeypatch.setattr(build, "estimate_bytes", lambda spec, module=None: 0)
    cache = SampleCache(FULL_DISK_SPECS["raw"], tiny_disk, workers=1)
    with cache, pytest.raises(DatasetError, match="writing the sample cache failed.*No space"):
        list(cache)
    assert list(tiny_disk.iterdir()) == []
