from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import simplejpeg
from PIL import Image

import data_gen
from storebench.formats import CorruptSampleError, open_dataset
from storebench.loaders import (
    Batch,
    InsufficientMemoryError,
    LazyDataset,
    PreloadedDataset,
    collate_padded,
)


def expected_raw(spec, indices):
    return np.stack([data_gen.sample(spec, int(i))[0] for i in indices])


def test_lazy_raw_batches_are_the_canonical_samples_in_order(memmap_raw):
    dataset = LazyDataset(memmap_raw)
    indices = np.array([511, 3, 3, 0, 200])
    out = np.zeros((8, 32, 32, 3), dtype=np.uint8)
    batch = dataset.get_batch(indices, out=out)
    assert np.shares_memory(batch.images, out)
    np.testing.assert_array_equal(batch.images, expected_raw(memmap_raw.spec, indices))
    assert batch.labels.tolist() == [data_gen.sample(memmap_raw.spec, int(i))[1] for i in indices]
    assert batch.indices.tolist() == indices.tolist()
    image, label = dataset[-1]
    np.testing.assert_array_equal(image, data_gen.sample(memmap_raw.spec, 511)[0])
    with pytest.raises(IndexError, match="512"):
        dataset[512]


def test_getitems_is_a_sequence_of_samples(memmap_raw):
    batch = LazyDataset(memmap_raw).__getitems__([4, 9])
    assert isinstance(batch, Batch) and len(batch) == 2
    samples = list(batch)
    np.testing.assert_array_equal(samples[1][0], data_gen.sample(memmap_raw.spec, 9)[0])
    assert samples[1][1] == data_gen.sample(memmap_raw.spec, 9)[1]


def test_preloaded_raw_is_one_array_equal_to_lazy(memmap_raw):
    preloaded = PreloadedDataset(memmap_raw, progress=False)
    n = len(memmap_raw)
    assert preloaded.images.shape == (n, 32, 32, 3) and preloaded.images.flags.c_contiguous
    assert preloaded.footprint_bytes == n * 32 * 32 * 3 + 8 * n
    indices = np.random.default_rng(0).permutation(n)[:100]
    np.testing.assert_array_equal(
        preloaded.get_batch(indices).images, LazyDataset(memmap_raw).get_batch(indices).images
    )
    np.testing.assert_array_equal(preloaded.labels, memmap_raw.read_many(np.arange(n))[1])


def test_preload_refuses_early_when_memory_would_not_fit(memmap_raw):
    with pytest.raises(InsufficientMemoryError, match=r"preloading needs .* available"):
        PreloadedDataset(memmap_raw, progress=False, max_memory_fraction=1e-9)
    assert issubclass(InsufficientMemoryError, MemoryError)


def test_preloaded_encoded_is_an_arena_of_the_stored_bytes(build_ci, encoded_format):
    with open_dataset(build_ci(encoded_format, "png")) as reader:
        preloaded = PreloadedDataset(reader, progress=False)
        n = len(reader)
        assert preloaded.offsets.shape == (n + 1,) and preloaded.offsets[0] == 0
        assert preloaded.arena.nbytes == preloaded.offsets[-1]
        for i in (0, 77, n - 1):
            assert preloaded[i][0] == data_gen.sample(reader.spec, i)[0]
        batch = preloaded.get_batch([5, 1])
        assert batch.images == [
            data_gen.sample(reader.spec, 5)[0],
            data_gen.sample(reader.spec, 1)[0],
        ]
        assert preloaded.footprint_bytes >= preloaded.offsets[-1] + 16 * n


@pytest.mark.parametrize("kind", [LazyDataset, PreloadedDataset])
def test_png_decodes_to_the_exact_rendered_pixels(build_ci, encoded_format, kind):
    with open_dataset(build_ci(encoded_format, "png")) as reader:
        dataset = kind(
            reader, decode="pil", **({"progress": False} if kind is PreloadedDataset else {})
        )
        indices = [3, 0, 255]
        batch = dataset.get_batch(indices)
        assert batch.images.shape == (3, 32, 32, 3) and batch.images.dtype == np.uint8
        rendered = np.stack([data_gen.render(reader.spec, i)[0] for i in indices])
        np.testing.assert_array_equal(batch.images, rendered)  # PNG is lossless


@pytest.mark.parametrize("decode", ["simplejpeg", "pil"])
def test_jpeg_decoders_match_decoding_the_stored_bytes(build_ci, encoded_format, decode):
    with open_dataset(build_ci(encoded_format, "jpeg")) as reader:
        dataset = LazyDataset(reader, decode=decode)
        out = np.empty((2, 64, 64, 3), dtype=np.uint8)
        batch = dataset.get_batch([10, 2], out=out)
        assert np.shares_memory(batch.images, out)
        for k, i in enumerate([10, 2]):
            stored = data_gen.sample(reader.spec, i)[0]
            if decode == "simplejpeg":
                want = simplejpeg.decode_jpeg(stored, colorspace="RGB")
            else:
                want = np.asarray(Image.open(io.BytesIO(stored)).convert("RGB"))
            np.testing.assert_array_equal(batch.images[k], want)
            np.testing.assert_array_equal(dataset[i][0], want)


def test_decoder_choice_is_checked(build_ci, encoded_format, memmap_raw):
    with open_dataset(build_ci(encoded_format, "png")) as reader:
        with pytest.raises(ValueError, match="simplejpeg decodes JPEG only.*decode='pil'"):
            LazyDataset(reader, decode="simplejpeg")
        with pytest.raises(ValueError, match="decode must be"):
            LazyDataset(reader, decode="opencv")
    with pytest.raises(ValueError, match="nothing to decode"):
        LazyDataset(memmap_raw, decode="pil")


def test_undecodable_bytes_raise_corrupt_sample_naming_the_index(build_ci, encoded_format):
    with open_dataset(build_ci(encoded_format, "jpeg")) as reader:
        preloaded = PreloadedDataset(reader, decode="simplejpeg", progress=False)
        start, stop = preloaded.offsets[7], preloaded.offsets[8]
        preloaded.arena[start + 2 : stop] = 0  # keep the SOI marker, wipe the rest
        with pytest.raises(CorruptSampleError, match="sample 7: cannot decode jpeg"):
            preloaded.get_batch([6, 7])
        np.testing.assert_array_equal(
            preloaded[6][0], LazyDataset(reader, decode="simplejpeg")[6][0]
        )


def test_transform_runs_per_sample_after_decode(memmap_raw):
    dataset = LazyDataset(memmap_raw, transform=lambda img: img[::2, ::2, 0].astype(np.float32))
    batch = dataset.get_batch([1, 2])
    assert batch.images.shape == (2, 16, 16) and batch.images.dtype == np.float32
    np.testing.assert_array_equal(
        batch.images[1], data_gen.sample(memmap_raw.spec, 2)[0][::2, ::2, 0]
    )
    assert dataset.sample_shape is None
    assert dataset.probe() == ((16, 16), np.dtype(np.float32))


def test_variable_size_samples_stay_a_list_and_collate_padded(memmap_raw):
    dataset = LazyDataset(memmap_raw, transform=lambda img: img[: 8 + img[0, 0, 0] % 9])
    batch = dataset.get_batch(range(12))
    assert isinstance(batch.images, list)
    padded, shapes = collate_padded(batch.images)
    assert padded.shape == (12, shapes[:, 0].max(), 32, 3)
    for k, img in enumerate(batch.images):
        np.testing.assert_array_equal(padded[k, : img.shape[0]], img)
        assert not padded[k, img.shape[0] :].any()


def test_lazy_dataset_pickles_without_handles(memmap_raw):
    dataset = LazyDataset(memmap_raw)
    dataset[0]  # open the handles
    clone = pickle.loads(pickle.dumps(dataset))
    np.testing.assert_array_equal(clone.get_batch([9]).images, dataset.get_batch([9]).images)


@pytest.mark.parametrize("kind", ["lazy", "preloaded"])
def test_dataset_indices_follow_the_readers_rules(memmap_raw, kind):
    """Integers only (NumPy ones too), negative ones from the end, in [i] and batches alike."""
    reader = memmap_raw
    dataset = LazyDataset(reader) if kind == "lazy" else PreloadedDataset(reader, progress=False)
    with dataset:
        n, spec = len(dataset), reader.spec
        assert np.array_equal(dataset[-1][0], data_gen.sample(spec, n - 1)[0])
        assert np.array_equal(dataset[np.uint32(n - 1)][0], dataset[-1][0])
        batch = dataset.get_batch([-1, 0, np.int64(-n)])
        assert list(batch.indices) == [n - 1, 0, 0]
        assert np.array_equal(batch.images, expected_raw(spec, [n - 1, 0, 0]))
        for bad in (True, 2.0, "1"):
            with pytest.raises(TypeError, match="is a"):
                dataset[bad]
        for bad in ([True, False], [0.0, 1.0], ["1"]):
            with pytest.raises(TypeError):
                dataset.get_batch(bad)
        with pytest.raises(IndexError, match=f"sample index {-n - 1} out of range"):
            dataset.get_batch([0, -n - 1])
        with pytest.raises(IndexError, match=f"sample index {n} out of range"):
            dataset[n]
