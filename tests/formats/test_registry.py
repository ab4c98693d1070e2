"""The format registry: every format listed without importing one, each module imported when
first asked for, so a case process pays for its own format's library alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from storebench.formats import (
    FORMATS,
    PEER_FORMAT_MODULES,
    get_format,
    is_peer_format,
)

FORMAT_MODULES = ("rawfiles", "hdf5", "lmdb", "memmap", "tfrecord", "parquet", "webdataset_tar",
                  "litdata_chunks", "mds", "lance_table", "zarr_array", "ffcv_beton")


def _loaded_after(code: str) -> list[str]:
    """The format modules and format libraries a fresh interpreter holds after ``code``."""
    script = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        watched = {[f"storebench.formats.{m}" for m in FORMAT_MODULES]!r} + [
            "pyarrow", "h5py", "lmdb", "google.protobuf"]
        print(json.dumps(sorted(m for m in watched if m in sys.modules)))
    """)
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               check=True)
    return json.loads(completed.stdout.splitlines()[-1])


def test_listing_the_formats_imports_none_of_them():
    loaded = _loaded_after("""
        from storebench.formats import FORMATS
        names = list(FORMATS), len(FORMATS), "hdf5" in FORMATS, FORMATS.core
    """)
    assert loaded == []


def test_opening_a_dataset_imports_its_format_alone(ci_dataset):
    path = ci_dataset("memmap", "raw")
    loaded = _loaded_after(f"""
        from storebench.formats import open_dataset
        with open_dataset({str(path)!r}) as reader:
            reader[0]
    """)
    assert loaded == ["storebench.formats.memmap"]


def test_a_case_worker_and_its_watcher_start_without_a_format_or_the_loaders():
    for module in ("storebench.bench.worker", "storebench.bench.watcher"):
        completed = subprocess.run(
            [sys.executable, "-c", f"import json, sys, {module}; print(json.dumps(sorted(m for "
             "m in sys.modules if m.startswith(('storebench.formats', 'storebench.loaders', "
             "'numpy')))))"],
            capture_output=True, text=True, check=True)
        held = json.loads(completed.stdout)
        if module.endswith("watcher"):
            assert held == []
        else:
            assert [m for m in held if m.startswith("storebench.")] == []


def test_each_name_is_its_modules_name_and_the_peers_are_the_modules_that_say_so():
    for name, module in FORMATS.items():
        assert name == module.NAME
        assert is_peer_format(name) == bool(getattr(module, "PEER", False))
        assert (name in FORMATS.core) != (name in PEER_FORMAT_MODULES)


def test_an_unknown_format_is_named_with_the_known_ones():
    assert "nope" not in FORMATS
    with pytest.raises(KeyError, match=r"unknown format 'nope'; known formats: \['ffcv', "):
        get_format("nope")
    with pytest.raises(KeyError):
        FORMATS["nope"]
    assert FORMATS.get("nope") is None
