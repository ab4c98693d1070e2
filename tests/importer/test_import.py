"""``storebench import``: a user's folder (or listing) in every format, the same bytes read back
by each format's own library, verify against the sources, clear errors on bad images."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from image_folder import CLASS_NAMES, make_image_folder
from PIL import Image

from storebench.formats import (
    FORMATS,
    DatasetError,
    find_datasets,
    open_dataset,
    read_manifest,
)
from storebench.formats.specs import ImportedSpec, VariableShapeError
from storebench.importer import (
    SourceImageError,
    import_images,
    parse_resize,
    plan_import,
    resized_pixels,
    scan_source,
)
from storebench.verify import verify_dataset

# storebench import writes the core formats (the peer formats are the peers study's).
ENCODED_FORMATS = [name for name, m in FORMATS.items()
                   if "mixed" in m.ENCODINGS and name in FORMATS.core]
RESIZE = (20, 24)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("my images")
    return root, make_image_folder(root)


@pytest.fixture(scope="module")
def imported(source, tmp_path_factory):
    root, _ = source
    out = tmp_path_factory.mktemp("imported")
    lines = []
    results = import_images(root, out, resize=RESIZE, progress=False, log=lines.append)
    return out, results, lines


def source_labels(root: Path, files: list[Path]) -> list[int]:
    return [CLASS_NAMES.index(p.relative_to(root).parts[0]) for p in files]


def test_every_format_gets_a_copy(imported, source):
    out, results, lines = imported
    root, files = source
    names = sorted(p.name for p in find_datasets(out))
    assert names == sorted([f"{f}-mixed" for f in ENCODED_FORMATS]
                           + [f"{f}-raw" for f in FORMATS.core])
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]
    manifest = read_manifest(out / "lmdb-mixed")
    spec = ImportedSpec.from_dict(manifest["spec"])
    assert spec.class_names == CLASS_NAMES
    assert spec.num_samples == len(files) and spec.encoding == "mixed"
    assert not spec.fixed_size  # the files differ in size
    assert spec.stored_bytes == sum(p.stat().st_size for p in files)
    assert manifest["raw_bytes"] == sum(
        Image.open(p).size[0] * Image.open(p).size[1] * 3 for p in files)
    raw = ImportedSpec.from_dict(read_manifest(out / "memmap-raw")["spec"])
    assert (raw.height, raw.width, raw.encoding) == (*RESIZE, "raw")
    assert raw.source_digest == spec.source_digest


def test_encoded_samples_are_the_source_bytes_in_order(imported, source):
    out, _, _ = imported
    root, files = source
    labels = source_labels(root, files)
    for name in ENCODED_FORMATS:
        with open_dataset(out / f"{name}-mixed") as reader:
            images, got = reader.read_many(np.arange(len(reader)))
            assert [bytes(x) for x in images] == [p.read_bytes() for p in files], name
            assert got.tolist() == labels, name


def test_raw_copies_hold_the_resized_pixels(imported, source):
    out, _, _ = imported
    root, files = source
    want = np.stack([resized_pixels(p.read_bytes(), p, *RESIZE) for p in files])
    assert want.shape == (len(files), *RESIZE, 3)
    for name in FORMATS.core:
        with open_dataset(out / f"{name}-raw") as reader:
            images, _ = reader.read_many(np.arange(len(reader)))
            assert np.array_equal(images, want), name


def test_cmyk_greyscale_and_palette_images_resize_as_rgb(source):
    root, files = source
    for path in files:
        with Image.open(path) as image:
            want = np.asarray(image.convert("RGB").resize(RESIZE[::-1], Image.BILINEAR))
            modes = image.mode
        assert np.array_equal(resized_pixels(path.read_bytes(), path, *RESIZE), want), modes


def test_variable_sizes_have_no_single_shape(imported):
    out, _, _ = imported
    with open_dataset(out / "hdf5-mixed") as reader, pytest.raises(
            VariableShapeError, match="differ in size.*Resize.*--resize HxW"):
        reader.spec.image_shape  # noqa: B018 - the property raises


def test_formats_own_libraries_read_the_import(imported, source):
    import h5py
    import lmdb
    import pyarrow.parquet as pq

    out, _, _ = imported
    root, files = source
    sizes = [Image.open(p).size for p in files]
    data = [p.read_bytes() for p in files]
    labels = source_labels(root, files)
    with h5py.File(out / "hdf5-mixed" / "data.h5", "r") as f:
        offsets = f["offsets"][:]
        assert [f["images"][offsets[i]:offsets[i + 1]].tobytes() for i in range(len(files))
                ] == data
        assert f["shapes"][:].tolist() == [[h, w, 3] for w, h in sizes]
        assert json.loads(f.attrs["class_names"]) == list(CLASS_NAMES)
    env = lmdb.open(str(out / "lmdb-mixed"), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            assert [txn.get(b"%08d" % i) for i in range(len(files))] == data
    finally:
        env.close()
    table = pq.read_table(next((out / "parquet-mixed").glob("*.parquet")))
    assert table.column("image").to_pylist() == data
    assert table.column("label").to_pylist() == labels
    folder = out / "rawfiles-mixed"
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == sorted(CLASS_NAMES)
    for i, path in enumerate(files):
        suffix = ".png" if path.suffix.lower() == ".png" else ".jpg"
        copy = folder / CLASS_NAMES[labels[i]] / f"{i:06d}{suffix}"
        assert copy.read_bytes() == path.read_bytes()


def test_tensorflow_reads_per_record_shapes(imported, source):
    tf = pytest.importorskip("tensorflow")
    from storebench.formats.tfrecord import shard_paths, tf_feature_spec

    out, _, _ = imported
    _, files = source
    records = tf.data.TFRecordDataset([str(p) for p in shard_paths(out / "tfrecord-mixed")])
    got = [tf.io.parse_single_example(r, tf_feature_spec()) for r in records]
    assert [x["image"].numpy() for x in got] == [p.read_bytes() for p in files]
    for example, path in zip(got, files, strict=True):
        width, height = Image.open(path).size
        decoded = tf.io.decode_image(example["image"], channels=3, expand_animations=False)
        assert (int(example["height"]), int(example["width"]), int(example["channels"])) == (
            height, width, 3)
        assert tuple(decoded.shape) == (height, width, 3)


def test_verify_compares_with_the_sources(imported):
    out, _, _ = imported
    for path in find_datasets(out):
        result = verify_dataset(path)
        assert result.ok, (path, result.message)
        assert result.samples_checked == read_manifest(path)["num_samples"]


def test_verify_names_a_changed_source(source, tmp_path):
    root, files = source
    out = tmp_path / "out"
    copy_root = tmp_path / "src"
    subprocess.run(["cp", "-r", str(root), str(copy_root)], check=True)
    import_images(copy_root, out, formats=["lmdb"], progress=False)
    victim = copy_root / files[5].relative_to(root)
    victim.write_bytes(files[6].read_bytes())
    result = verify_dataset(out / "lmdb-mixed")
    assert not result.ok
    assert "sample 5: image bytes differ from the source" in result.message
    assert str(victim) in result.message


def test_reimport_of_the_same_source_is_found_not_rebuilt(imported, source):
    out, results, _ = imported
    root, _ = source
    again = import_images(root, out, resize=RESIZE, progress=False)
    assert [r.skipped for r in again] == [True] * len(results)


def test_a_damaged_image_fails_the_import_naming_it_and_writes_nothing(source, tmp_path):
    root, files = source
    copy_root = tmp_path / "src"
    subprocess.run(["cp", "-r", str(root), str(copy_root)], check=True)
    damaged = copy_root / files[3].relative_to(root)
    damaged.write_bytes(damaged.read_bytes()[: len(damaged.read_bytes()) // 2])
    out = tmp_path / "out"
    with pytest.raises(SourceImageError, match="cannot decode") as err:
        import_images(copy_root, out, progress=False)
    assert err.value.path == damaged
    assert str(damaged) in str(err.value)
    assert not out.exists() or not list(out.iterdir())


def test_skip_leaves_bad_images_out_and_counts_them(source, tmp_path):
    root, files = source
    copy_root = tmp_path / "src"
    subprocess.run(["cp", "-r", str(root), str(copy_root)], check=True)
    not_image = copy_root / files[0].relative_to(root)
    not_image.write_bytes(b"GIF89a pretending to be a JPEG")
    lines = []
    out = tmp_path / "out"
    import_images(copy_root, out, formats=["parquet"], on_error="skip", progress=False,
                  log=lines.append)
    assert any(line.startswith("skipped 1 unreadable image(s)") for line in lines)
    sources = json.loads((out / "parquet-mixed" / "sources.json").read_text())
    assert sources["skipped"] == [{
        "path": str(files[0].relative_to(root)),
        "reason": "not a JPEG or PNG file (it starts with b'GIF89a p'); convert it or leave "
                  "it out",
    }]
    dataset = find_datasets(out)[0]
    assert read_manifest(dataset)["num_samples"] == len(files) - 1
    assert verify_dataset(dataset).ok


def test_memmap_needs_a_resize(source, tmp_path):
    root, _ = source
    with pytest.raises(ValueError, match=r"memmap store raw arrays.*--resize HxW"):
        import_images(root, tmp_path / "out", formats=["memmap"], progress=False)


def test_csv_listing_with_class_names(source, tmp_path):
    root, files = source
    listing = root / "listing.csv"
    rows = ["path,label"] + [f'"{p.relative_to(root)}",{p.relative_to(root).parts[0]}'
                             for p in files[::-1]]
    listing.write_text("\n".join(rows) + "\n")
    try:
        scanned = scan_source(listing)
        assert scanned.class_names == CLASS_NAMES
        assert scanned.paths == tuple(str(p.relative_to(root)) for p in files[::-1])
        assert scanned.labels.tolist() == source_labels(root, files)[::-1]
    finally:
        listing.unlink()


def test_parquet_listing_with_integer_labels(source, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root, files = source
    listing = tmp_path / "list.parquet"
    pq.write_table(pa.table({"path": [str(p) for p in files[:4]],
                             "label": pa.array([3, 0, 3, 1], pa.int64())}), listing)
    plan = plan_import(listing)
    assert plan.encoded_spec.class_names == ("0", "1", "2", "3")
    assert plan.listing.labels.tolist() == [3, 0, 3, 1]


@pytest.mark.parametrize("content, message", [
    ("file,label\na.jpg,x\n", "needs columns 'path' and 'label'; it lacks ['path']"),
    ("path,label\n", "the listing has no rows"),
    ("path,label\na.jpg,bad/name\n", "class name 'bad/name' cannot be a folder name"),
    ('path,label\na.jpg,"two\nlines"\n', "class name 'two\\nlines' cannot be a folder name"),
])
def test_bad_listings_are_refused_clearly(tmp_path, content, message):
    listing = tmp_path / "list.csv"
    listing.write_text(content)
    with pytest.raises(DatasetError, match=re.escape(message)):
        scan_source(listing)


def test_limit_keeps_every_class(source):
    root, files = source
    scanned = scan_source(root, limit=6)
    assert len(scanned) == 6
    assert set(scanned.labels.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("text, want", [("224x224", (224, 224)), ("64", (64, 64)),
                                        ("32X48", (32, 48))])
def test_parse_resize(text, want):
    assert parse_resize(text) == want


@pytest.mark.parametrize("text", ["x", "0x4", "1x2x3", "axb"])
def test_parse_resize_refuses(text):
    with pytest.raises(ValueError, match="--resize takes HxW"):
        parse_resize(text)


def test_cli_import_and_verify(source, tmp_path):
    root, files = source
    out = tmp_path / "cli out"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-m", "storebench", "import", str(root), "--out", str(out),
         "--formats", "lmdb", "rawfiles", "--quiet"],
        capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"built  {out / 'lmdb-mixed'}  {len(files)} images, 3 classes" in done.stdout
    assert f"next: storebench verify {out}" in done.stdout
    checked = subprocess.run([sys.executable, "-m", "storebench", "verify", str(out), "--quiet"],
                             capture_output=True, text=True, env=env, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("OK   ") == 2


def test_cli_refuses_a_missing_source_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "storebench", "import", str(tmp_path / "nope"), "--out",
         str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"storebench import: {tmp_path / 'nope'}: no such folder or listing file")


def test_a_study_refuses_an_import_named_like_a_profile(source, tmp_path):
    from storebench.study import imported_data_dir

    root, _ = source
    out = tmp_path / "small"
    import_images(root, out, formats=["lmdb"], progress=False)
    with pytest.raises(ValueError, match="cannot be named like a synthetic profile"):
        imported_data_dir(out)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no imported dataset"):
        imported_data_dir(tmp_path / "empty")
