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
from storebench.formats import build_dataset, open_dataset, read_manifest
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
    spec = data_gen.DatasetSpec(4000, 64, 64, encoding="png", seed=9)
    code = (
        "import data_gen, sys\n"
        "from storebench.formats import build_dataset\n"
        f"spec = data_gen.DatasetSpec(**{spec.to_dict()!r})\n"
        "if __name__ == '__main__':\n"
        f"    build_dataset(spec, 'rawfiles', {str(tmp_path)!r}, workers=1)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(TMP_PREFIX) for p in tmp_path.iterdir()):
        assert time.monotonic() < deadline and child.poll() is None, "build never started"
        time.sleep(0.05)
    time.sleep(0.5)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    leftovers = list(tmp_path.iterdir())
    assert leftovers and all(p.name.startswith(TMP_PREFIX) for p in leftovers)
    assert not list(tmp_path.rglob("manifest.json"))
    small = data_gen.DatasetSpec(8, 8, 8, encoding="png")
    build_dataset(small, "hdf5", tmp_path, workers=1)  # a later build sweeps the dead one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hdf5-png"]
