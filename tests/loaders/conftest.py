"""Datasets of the ``ci`` profile, built once per session for the loader tests."""

from __future__ import annotations

import pytest

from data_gen import PROFILES
from storebench.formats import FORMATS, build_dataset, open_dataset


@pytest.fixture(scope="session")
def build_ci(tmp_path_factory):
    """``build_ci(format, encoding) -> Path`` of that ``ci`` dataset, built on first use;
    skips when the format is not (yet) in the registry."""
    root = tmp_path_factory.mktemp("loaders-ci")
    built = {}

    def build(format_name: str, encoding: str):
        if format_name not in FORMATS:
            pytest.skip(f"format {format_name!r} is not in storebench.formats.FORMATS")
        key = (format_name, encoding)
        if key not in built:
            spec = PROFILES["ci"].spec_for(encoding)
            built[key] = build_dataset(spec, format_name, root, workers=1).path
        return built[key]

    return build


@pytest.fixture
def memmap_raw(build_ci):
    """An open reader of the ci raw set as memmap (512 samples of 32x32x3)."""
    with open_dataset(build_ci("memmap", "raw")) as reader:
        yield reader


@pytest.fixture
def encoded_format():
    """A format that stores encoded samples (the first registered one that can)."""
    for name in ("lmdb", "hdf5", "rawfiles", "tfrecord", "parquet"):
        if name in FORMATS and "jpeg" in FORMATS[name].ENCODINGS:
            return name
    pytest.skip("no format storing PNG/JPEG is registered yet")
