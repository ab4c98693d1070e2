"""Lance and Zarr: the ``lance`` and ``zarr`` formats read back by the libraries themselves,
their blocks, fork behaviour, and damage the generic corruption tests do not reach.

(Neither has a loader path of its own: storebench's loaders read them through the Reader,
which ``tests/formats`` covers with the other formats.)
"""

from __future__ import annotations

import multiprocessing
import os
import shutil

import numpy as np
import pytest

import data_gen
from storebench.formats import (
    CorruptSampleError,
    DatasetError,
    build_dataset,
    get_format,
    lance_table,
    open_dataset,
    read_manifest,
    zarr_array,
)

pytestmark = pytest.mark.peers

# Blocks of 100 samples: the ci sets (256 JPEG, 512 raw) span several fragments / chunks.
KNOBS = {"lance": {"max_rows_per_file": 100}, "zarr": {"chunk_samples": 100}}
ENCODINGS = ("jpeg", "raw")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(format, encoding) -> (root, spec)``, built on first use (skips where the
    library is missing)."""
    root = tmp_path_factory.mktemp("lance-zarr")
    done = {}

    def build(format_name, encoding):
        pytest.importorskip(get_format(format_name).LIBRARIES[0])
        if (format_name, encoding) not in done:
            spec = data_gen.PROFILES["ci"].spec_for(encoding)
            result = build_dataset(spec, format_name, root, workers=1,
                                   knobs=KNOBS[format_name])
            done[format_name, encoding] = (result.path, spec)
        return done[format_name, encoding]

    return build


def copy_of(built, tmp_path, format_name, encoding):
    source, spec = built(format_name, encoding)
    target = tmp_path / source.name
    shutil.copytree(source, target)
    return target, spec


def same(got, want) -> bool:
    return got == want if isinstance(want, bytes) else np.array_equal(got, want)


# -- the libraries read our files -----------------------------------------------------------
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_lance_reads_the_files_bit_identically(built, encoding):
    lance = pytest.importorskip("lance")

    root, spec = built("lance", encoding)
    dataset = lance.dataset(str(root / lance_table.DATASET_DIR))
    table = dataset.to_table()
    assert table.num_rows == spec.num_samples
    assert table.column("index").to_pylist() == list(range(spec.num_samples))
    images = table.column("image").to_pylist()
    for i, (label, image) in enumerate(zip(table.column("label").to_pylist(), images)):
        want_image, want_label = data_gen.sample(spec, i)
        if encoding == "raw":
            image = np.frombuffer(image, np.uint8).reshape(spec.image_shape)
        assert same(image, want_image) and label == want_label, f"sample {i}"
    # Random access, Lance's way.
    taken = dataset.take([200, 3, 200], columns=["image", "label"])
    assert taken.column("label").to_pylist() == [data_gen.sample(spec, i)[1] for i in
                                                 (200, 3, 200)]
    # One fragment per 100 rows, each in a file named after it.
    fragments = sorted(dataset.get_fragments(), key=lambda f: f.fragment_id)
    assert [f.count_rows() for f in fragments][:2] == [100, 100]
    assert [f.metadata.files[0].path for f in fragments] == [
        lance_table.fragment_name(k) for k in range(len(fragments))]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_zarr_reads_the_files_bit_identically(built, encoding):
    zarr = pytest.importorskip("zarr")

    root, spec = built("zarr", encoding)
    group = zarr.open_group(str(root / zarr_array.GROUP_DIR), mode="r")
    images, labels = group["images"], group["labels"]
    assert images.chunks[0] == 100 and group.attrs["storebench.spec"] == spec.to_dict()
    stored = images[:]  # slices (a lone vlen-bytes element comes back as a 0-d |S array)
    for i in range(spec.num_samples):
        want_image, want_label = data_gen.sample(spec, i)
        assert same(stored[i], want_image) and labels[i] == want_label, f"sample {i}"
    if encoding == "raw":
        assert stored.dtype == np.uint8 and stored.shape == (spec.num_samples,
                                                             *spec.image_shape)


@pytest.mark.parametrize("format_name", ["lance", "zarr"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_reader_blocks_and_reads_across_blocks(built, format_name, encoding):
    root, spec = built(format_name, encoding)
    n = spec.num_samples
    with open_dataset(root) as reader:
        assert list(reader.blocks()) == [*range(0, n, 100), n]
        rng = np.random.default_rng(5)
        for indices in (rng.permutation(n), np.arange(95, 205), rng.integers(0, n, 7),
                        np.array([150, 150, 2])):
            images, labels = reader.read_many(indices)
            for k, i in enumerate(indices):
                want_image, want_label = data_gen.sample(spec, int(i))
                assert same(images[k], want_image) and labels[k] == want_label
        assert {reader._locate(i).name for i in (0, 99)} == {reader._locate(0).name}
        assert reader._locate(0) != reader._locate(100)


def test_zarr_compressor_knob(tmp_path):
    pytest.importorskip("zarr")
    spec = data_gen.DatasetSpec(num_samples=40, height=8, width=8, encoding="raw", seed=4)
    root = build_dataset(spec, "zarr", tmp_path, workers=1,
                         knobs={"chunk_samples": 16, "compressor": "zstd"}).path
    with open_dataset(root) as reader:
        images, labels = reader.read_many(np.arange(40)[::-1])
    assert all(same(images[k], data_gen.sample(spec, 39 - k)[0]) for k in range(40))
    with pytest.raises(ValueError, match="compressor must be one of"):
        build_dataset(spec, "zarr", tmp_path / "bad", knobs={"compressor": "lzma"})


# -- processes ------------------------------------------------------------------------------
def read_labels(reader, indices, queue):
    try:
        queue.put(("ok", reader.read_many(indices)[1].tolist()))
    except Exception as err:  # sent back to the test
        queue.put((type(err).__name__, str(err)))


def run_in_child(context, reader, indices):
    queue = context.Queue()
    child = context.Process(target=read_labels, args=(reader, indices, queue))
    child.start()
    try:
        return queue.get(timeout=60)
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_lance_refuses_a_forked_child_instead_of_hanging(built):
    root, spec = built("lance", "raw")
    with open_dataset(root) as reader:
        reader.read_many([0, 1])  # Lance's threads run in this process now
        kind, message = run_in_child(multiprocessing.get_context("fork"), reader, [5, 300])
        assert kind == "DatasetError" and "not fork-safe" in message and "spawn" in message
        kind, labels = run_in_child(multiprocessing.get_context("forkserver"), reader,
                                    [5, 300])
    assert kind == "ok" and labels == [data_gen.sample(spec, i)[1] for i in (5, 300)]


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_zarr_reads_in_a_forked_child(built):
    root, spec = built("zarr", "jpeg")
    with open_dataset(root) as reader:
        reader.read_many([0, 150])  # Zarr's event loop runs in this process now
        kind, labels = run_in_child(multiprocessing.get_context("fork"), reader, [5, 250])
    assert kind == "ok" and labels == [data_gen.sample(spec, i)[1] for i in (5, 250)]


# -- damage ---------------------------------------------------------------------------------
def flip_sample_byte(root, spec, index):
    """Flip a byte in the middle of sample ``index``'s stored bytes; the file it is in."""
    image = data_gen.sample(spec, index)[0]
    needle = image if isinstance(image, bytes) else image.tobytes()
    for rel in read_manifest(root)["files"]:
        data = bytearray((root / rel).read_bytes())
        at = data.find(needle)
        if at >= 0:
            data[at + len(needle) // 2] ^= 0x01
            (root / rel).write_bytes(bytes(data))
            return root / rel
    raise AssertionError(f"sample {index} not found under {root}")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_zarr_chunk_checksum_catches_a_flipped_byte_even_without_verify(
    built, tmp_path, encoding
):
    root, spec = copy_of(built, tmp_path, "zarr", encoding)
    path = flip_sample_byte(root, spec, 150)
    with open_dataset(root, verify=False) as reader:
        # The whole chunk (samples 100..199) is refused, naming its file.
        with pytest.raises(CorruptSampleError, match="chunk 1 .*unreadable") as err:
            reader[120]
        assert err.value.path == path
        with pytest.raises(CorruptSampleError):
            reader.read_many([0, 250, 160])  # several chunks: one Zarr call, then per chunk
        assert same(reader[99][0], data_gen.sample(spec, 99)[0])
    with open_dataset(root, verify=True) as reader:
        # The per-sample checksums pin it to sample 150; the chunk's others stay readable.
        with pytest.raises(CorruptSampleError) as err:
            reader.read_many([120, 150])
        assert err.value.index == 150 and err.value.path == path
        assert same(reader[120][0], data_gen.sample(spec, 120)[0])
        images, _ = reader.read_many([199, 100, 0])
        assert same(images[1], data_gen.sample(spec, 100)[0])


def test_zarr_missing_chunk_file_is_an_error_not_zeros(built, tmp_path):
    root, spec = copy_of(built, tmp_path, "zarr", "raw")
    manifest = read_manifest(root)
    path = root / zarr_array.GROUP_DIR / "images" / "c" / "2" / "0" / "0" / "0"
    for verify in (False, True):
        reader = get_format("zarr").open(root, manifest, verify=verify)
        with reader:
            reader.read_many([0])
            data = path.read_bytes()
            path.unlink()
            try:
                with pytest.raises(CorruptSampleError, match="missing.*zeros") as err:
                    reader[210]
                assert err.value.path == path
                with pytest.raises(CorruptSampleError, match="missing"):
                    reader.read_many([0, 210, 400])
            finally:
                path.write_bytes(data)
    path.unlink()
    with pytest.raises(DatasetError, match=f"{path}: listed in the manifest but missing"):
        get_format("zarr").open(root, manifest, verify=False)[0]


def test_lance_flipped_image_byte_is_caught_by_verify_only(built, tmp_path):
    """Lance keeps no checksum of values: verify=False returns the bytes as stored (the
    module docstring says so); verify=True names the sample and its fragment file."""
    root, spec = copy_of(built, tmp_path, "lance", "jpeg")
    path = flip_sample_byte(root, spec, 150)
    assert path.name == lance_table.fragment_name(1)
    with open_dataset(root, verify=True) as reader:
        with pytest.raises(CorruptSampleError) as err:
            reader.read_many([120, 150])
        assert err.value.index == 150 and err.value.path == path
        assert same(reader[151][0], data_gen.sample(spec, 151)[0])
    with open_dataset(root, verify=False) as reader:
        assert reader[150][0] != data_gen.sample(spec, 150)[0]


@pytest.mark.parametrize("verify", [False, True])
def test_lance_swapped_fragment_files_are_refused_past_the_fingerprints(
    built, tmp_path, verify
):
    """Fragments 1 and 2 (100 rows each) swapped: Lance reads either happily; the index
    column, checked at open, is not what the rows' positions say."""
    root, _ = copy_of(built, tmp_path, "lance", "raw")
    data = root / lance_table.DATASET_DIR / lance_table.DATA_DIR
    a, b = data / lance_table.fragment_name(1), data / lance_table.fragment_name(2)
    assert a.stat().st_size == b.stat().st_size
    content_a = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(content_a)
    with pytest.raises(DatasetError, match="not the file this dataset was built with"):
        open_dataset(root, verify=verify)
    reader = get_format("lance").open(root, read_manifest(root), verify=verify)
    with pytest.raises(DatasetError, match=f"{a}: its index column is not 100..199"):
        reader[0]


@pytest.mark.parametrize("verify", [False, True])
def test_lance_damaged_footer_is_a_dataset_error_naming_the_file(built, tmp_path, verify):
    root, _ = copy_of(built, tmp_path, "lance", "raw")
    path = root / lance_table.DATASET_DIR / lance_table.DATA_DIR / lance_table.fragment_name(3)
    with open(path, "r+b") as f:
        f.seek(-40, os.SEEK_END)
        f.write(bytes(40))
    reader = get_format("lance").open(root, read_manifest(root), verify=verify)
    with pytest.raises(DatasetError, match=f"{path}: .*not appear to be a Lance file"):
        reader.read_many([0, 350])


def test_zarr_block_shuffled_epoch_reads_each_chunk_once(tmp_path, monkeypatch):
    """Chunks of 64 (512 samples: eight), batches of 48: a batch spans one chunk or two,
    and one that ends in a lower-numbered chunk than it began in must leave that chunk
    cached, since the next batch goes on in it (read in chunk-number order, the epoch took
    13 reads of the 8 chunks)."""
    pytest.importorskip("zarr")
    from storebench.loaders import BatchSampler, BlockShuffleSampler

    root = build_dataset(data_gen.PROFILES["ci"].spec_for("raw"), "zarr", tmp_path,
                         workers=1, knobs={"chunk_samples": 64}).path
    with open_dataset(root, verify=False) as reader:
        reader[0]
        array_type = type(reader._h_images)
        reads = []
        real = array_type.__getitem__
        monkeypatch.setattr(array_type, "__getitem__",
                            lambda array, key: reads.append(key) or real(array, key))
        reader._h_cached = None
        for batch in BatchSampler(BlockShuffleSampler.from_reader(reader, seed=0), 48):
            reader.read_many(np.asarray(batch))
        assert sorted(key.start for key in reads) == list(range(0, 512, 64))
