"""Hostile datasets and buckets (issue 51, defects 1 and 2) against a real SeaweedFS server:
a download writes nothing outside its target, an upload sends nothing from outside its
dataset, and nothing at all unless every check passes."""

from __future__ import annotations

import contextlib
import json
import os

import pytest
from hostile import assert_one_line_error, bounded, copy_dataset, edit_manifest

from storebench.formats import ManifestError
from storebench.formats.manifest import manifest_digest
from storebench.remote.dataset import download_dataset, upload_dataset
from storebench.remote.s3 import ObjectStore, ObjectStoreError

pytestmark = pytest.mark.timeout(300)


def _rename(manifest: dict, old: str, new: str) -> None:
    for key in ("files", "fingerprints"):
        manifest[key][new] = manifest[key].pop(old)


@pytest.mark.parametrize("name", ["../../escape/newdir/pwned.txt", "/tmp/escape-pwned.txt"])
def test_1_download_refuses_a_manifest_naming_a_path_out_of_the_target(
        uploaded, s3, tmp_path, name):
    local_path, _ = uploaded("memmap", "raw")
    store = ObjectStore(f"s3://ci-data/hostile-dl/{abs(hash(name))}", s3)
    upload_dataset(local_path, store.root, s3=s3)
    manifest = json.loads((local_path / "manifest.json").read_text())
    _rename(manifest, "labels.npy", name)
    manifest["manifest_digest"] = manifest_digest(manifest)  # anyone can reseal it
    # The object the name points at, where the server takes such a key (pyarrow's
    # ArrowInvalid, for a leading '/', is a ValueError).
    with contextlib.suppress(ObjectStoreError, ValueError):
        store.write(name, (local_path / "labels.npy").read_bytes())
    store.write("manifest.json", json.dumps(manifest).encode())
    target = tmp_path / "a" / "b" / "staged"
    target.parent.mkdir(parents=True)
    with pytest.raises(ManifestError, match="must stay inside it"):
        download_dataset(str(store.root), target, s3=s3)
    assert not (tmp_path / "escape").exists() and not (tmp_path / "a" / "escape").exists()
    assert list((tmp_path / "a" / "b").iterdir()) == []


def test_2_upload_of_a_file_linked_out_of_the_dataset_sends_nothing(ci_dataset, s3, tmp_path):
    copy = copy_dataset(ci_dataset("memmap", "raw"), tmp_path / "memmap-raw")
    outside = tmp_path / "secret.npy"
    (copy / "labels.npy").rename(outside)
    (copy / "labels.npy").symlink_to(outside)  # same bytes: every size check would pass
    store = ObjectStore("s3://ci-data/hostile-up/link", s3)
    with pytest.raises(ManifestError, match="outside"):
        upload_dataset(copy, store.root, s3=s3)
    store.ensure_bucket()
    assert store.sizes() == {}


def test_2_upload_of_a_manifest_naming_a_parent_file_sends_nothing(ci_dataset, s3, tmp_path):
    copy = copy_dataset(ci_dataset("memmap", "raw"), tmp_path / "memmap-raw")
    (tmp_path / "labels.npy").write_bytes((copy / "labels.npy").read_bytes())
    edit_manifest(copy, lambda m: _rename(m, "labels.npy", "../labels.npy"))
    store = ObjectStore("s3://ci-data/hostile-up/parent", s3)
    with pytest.raises(ManifestError, match="must stay inside it"):
        upload_dataset(copy, store.root, s3=s3)
    store.ensure_bucket()
    assert store.sizes() == {}


def test_2_upload_refuses_a_fifo_before_sending_anything(ci_dataset, s3, tmp_path):
    copy = copy_dataset(ci_dataset("memmap", "raw"), tmp_path / "memmap-raw")
    (copy / "labels.npy").unlink()
    os.mkfifo(copy / "labels.npy")
    url = "s3://ci-data/hostile-up/fifo"
    # A child bounded in time: reading the FIFO would wait forever for a writer.
    result = bounded(["upload", str(copy), url, "--quiet"], env={**os.environ, **s3.env()})
    assert_one_line_error(result, "labels.npy", "FIFO")
    store = ObjectStore(url, s3)
    store.ensure_bucket()
    assert store.sizes() == {}
