"""Imported datasets of images of different sizes and modes through every loader path.

The datasets are real builds of an ``ImportedSpec`` in every format that stores encoded
images, from JPEG (RGB, greyscale, CMYK) and PNG (palette, RGBA, RGB) files of different
sizes. Expected pixels are computed here from the source files with Pillow (and simplejpeg
where the loader uses it), independently of the loaders.
"""

from __future__ import annotations

import io
import pickle
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import simplejpeg
from PIL import Image

from storebench.formats import build_dataset, open_dataset
from storebench.formats.build import SampleCache
from storebench.formats.specs import ImportedSpec, VariableShapeError
from storebench.loaders import (
    BatchSampler,
    CenterCrop,
    Compose,
    ImageTooSmallError,
    LazyDataset,
    PreloadedDataset,
    ProcessPrefetcher,
    Resize,
    ResizeShorter,
    SequentialSampler,
    ShuffleSampler,
    ThreadPrefetcher,
    collate_padded,
)

ENCODED_FORMATS = ["rawfiles", "hdf5", "lmdb", "tfrecord", "parquet"]
# (file format, Pillow mode) of the source images, cycled through.
KINDS = [
    ("JPEG", "RGB"),
    ("JPEG", "L"),
    ("JPEG", "CMYK"),
    ("PNG", "P"),
    ("PNG", "RGBA"),
    ("PNG", "RGB"),
]
NUM_SAMPLES = 18
CLASS_NAMES = ("a b", "ünï", "c")
# Every source image is at least this tall and wide, so crops up to it always fit.
MIN_SIDE = 40


def source_image(i: int, rng: np.random.Generator, size=None) -> tuple[bytes, str]:
    """Sample i's file bytes and Pillow mode: a gradient plus noise (so JPEG has detail to
    lose), of ``size`` (height, width) or else a random size between MIN_SIDE and 96 on
    each side."""
    file_format, mode = KINDS[i % len(KINDS)]
    height, width = size or (int(n) for n in rng.integers(MIN_SIDE, 97, size=2))
    y, x = np.mgrid[:height, :width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 7 % 256], axis=-1)
    pixels = np.clip(base + rng.integers(-20, 21, base.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    if mode == "P":
        image = image.quantize(16)
    elif mode == "RGBA":
        alpha = rng.integers(0, 256, (height, width), dtype=np.uint8)
        image = Image.fromarray(np.dstack([pixels, alpha]), "RGBA")
    elif mode != "RGB":
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, file_format, **({"quality": 90} if file_format == "JPEG" else {}))
    return buffer.getvalue(), mode


def imported_spec(samples, encoding: str, size=(0, 0)) -> ImportedSpec:
    return ImportedSpec(
        num_samples=len(samples),
        encoding=encoding,
        class_names=CLASS_NAMES,
        source="test images",
        source_digest=f"test-{encoding}-{size}",
        stored_bytes=sum(len(data) for data, _ in samples),
        height=size[0],
        width=size[1],
    )


class Source:
    """The source files of a built dataset: bytes, labels and modes by index."""

    def __init__(self, samples, modes) -> None:
        self.data = [data for data, _ in samples]
        self.labels = np.array([label for _, label in samples], dtype=np.int64)
        self.modes = modes

    def shape(self, i: int) -> tuple[int, int, int]:
        width, height = Image.open(io.BytesIO(self.data[i])).size
        return (height, width, 3)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The "mixed" set in every encoded format, and a JPEG-only set (RGB, greyscale and
    CMYK files) as lmdb: ``(roots, mixed_source, jpeg_root, jpeg_source)``."""
    root = tmp_path_factory.mktemp("variable-size")
    rng = np.random.default_rng(11)
    made = [source_image(i, rng) for i in range(NUM_SAMPLES)]
    samples = [(data, i % len(CLASS_NAMES)) for i, (data, _) in enumerate(made)]
    spec = imported_spec(samples, "mixed")
    roots = {}
    with SampleCache(spec, root, samples=lambda: iter(samples)) as cache:
        for name in ENCODED_FORMATS:
            roots[name] = build_dataset(spec, name, root / "data", source=cache).path
    jpeg_made = [source_image(i, rng) for i in range(NUM_SAMPLES) if KINDS[i % 6][0] == "JPEG"]
    jpeg_samples = [(data, i % len(CLASS_NAMES)) for i, (data, _) in enumerate(jpeg_made)]
    jpeg_spec = imported_spec(jpeg_samples, "jpeg")
    with SampleCache(jpeg_spec, root, samples=lambda: iter(jpeg_samples)) as cache:
        jpeg_root = build_dataset(jpeg_spec, "lmdb", root / "data", source=cache).path
    return (
        roots,
        Source(samples, [mode for _, mode in made]),
        jpeg_root,
        Source(jpeg_samples, [mode for _, mode in jpeg_made]),
    )


@pytest.fixture(scope="module")
def same_size(tmp_path_factory):
    """A "mixed" set whose files all are 36x52 (so its spec has that shape), as tfrecord:
    ``(root, source)``."""
    root = tmp_path_factory.mktemp("same-size")
    rng = np.random.default_rng(12)
    made = [source_image(i, rng, size=(36, 52)) for i in range(len(KINDS))]
    samples = [(data, i % len(CLASS_NAMES)) for i, (data, _) in enumerate(made)]
    spec = imported_spec(samples, "mixed", size=(36, 52))
    with SampleCache(spec, root, samples=lambda: iter(samples)) as cache:
        path = build_dataset(spec, "tfrecord", root / "data", source=cache).path
    return path, Source(samples, [mode for _, mode in made])


@pytest.fixture(scope="module")
def roots(built):
    return built[0]


@pytest.fixture(scope="module")
def source(built):
    return built[1]


# -- what the pixels should be, computed from the source files ---------------------------
def pil_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def decoded(data: bytes, decoder: str) -> np.ndarray:
    """What ``decoder`` should give: simplejpeg for JPEGs other than CMYK (which Pillow
    decodes on every path), Pillow for the rest."""
    is_jpeg = data[:3] == b"\xff\xd8\xff"
    if decoder != "pil" and is_jpeg and simplejpeg.decode_jpeg_header(data)[2] != "CMYK":
        return simplejpeg.decode_jpeg(data, colorspace="RGB")
    return pil_rgb(data)


def pil_resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    return np.asarray(Image.fromarray(image).resize((width, height), Image.Resampling.BILINEAR))


def resized(source: Source, indices, height: int, width: int, decoder: str = "auto"):
    return np.stack([pil_resize(decoded(source.data[i], decoder), height, width) for i in indices])


def open_kind(kind: str, reader, **options):
    if kind == "preloaded":
        return PreloadedDataset(reader, progress=False, **options)
    return LazyDataset(reader, **options)


# -- the spec and the decoders ------------------------------------------------------------
def test_the_spec_has_no_single_image_shape(roots):
    with open_dataset(roots["lmdb"]) as reader:
        assert not reader.spec.fixed_size
        with pytest.raises(VariableShapeError, match="differ in size.*Resize"):
            _ = reader.spec.image_shape
        dataset = LazyDataset(reader, decode="auto")
        assert dataset.is_ragged and dataset.sample_shape is None
        assert LazyDataset(reader).sample_shape is None  # encoded bytes
        resized_set = LazyDataset(reader, decode="auto", transform=Resize(24, 32))
        assert not resized_set.is_ragged and resized_set.sample_shape == (24, 32, 3)


@pytest.mark.parametrize("kind", ["lazy", "preloaded"])
@pytest.mark.parametrize("decoder", ["auto", "pil"])
@pytest.mark.parametrize("format_name", ENCODED_FORMATS)
def test_decoded_images_keep_their_own_shape_and_pixels(roots, source, format_name, decoder, kind):
    order = [17, 2, 0, 9, 5, 5, 14]
    with open_dataset(roots[format_name]) as reader:
        dataset = open_kind(kind, reader, decode=decoder)
        batch = dataset.get_batch(order)
        assert isinstance(batch.images, list) and len(batch.images) == len(order)
        assert batch.indices.tolist() == order
        assert batch.labels.tolist() == source.labels[order].tolist()
        for image, i in zip(batch.images, order, strict=True):
            assert image.shape == source.shape(i) and image.dtype == np.uint8
            np.testing.assert_array_equal(image, decoded(source.data[i], decoder))
        image, label = dataset[-1]
        np.testing.assert_array_equal(image, decoded(source.data[-1], decoder))
        assert label == source.labels[-1]


def test_every_decoder_gives_pillows_pixels_for_every_mode(built):
    """simplejpeg and Pillow agree exactly for RGB and greyscale JPEGs, and CMYK ones go to
    Pillow, so "auto", "pil" and "simplejpeg" are interchangeable on imported sets."""
    roots, source, jpeg_root, jpeg_source = built
    with open_dataset(roots["hdf5"]) as reader:
        auto = LazyDataset(reader, decode="auto").get_batch(range(NUM_SAMPLES))
        for i, image in enumerate(auto.images):
            np.testing.assert_array_equal(image, pil_rgb(source.data[i]), err_msg=source.modes[i])
    with open_dataset(jpeg_root) as reader:
        assert sorted(set(jpeg_source.modes)) == ["CMYK", "L", "RGB"]
        for decoder in ("simplejpeg", "auto", "pil"):
            batch = LazyDataset(reader, decode=decoder).get_batch(range(len(reader)))
            for i, image in enumerate(batch.images):
                assert image.shape == jpeg_source.shape(i)  # greyscale comes out as RGB
                np.testing.assert_array_equal(image, pil_rgb(jpeg_source.data[i]))
                if jpeg_source.modes[i] == "L":
                    assert (image == image[:, :, :1]).all()


def test_a_mixed_set_of_one_size_batches_as_fixed_size_sets_do(same_size):
    root, source = same_size
    with open_dataset(root) as reader:
        assert reader.spec.fixed_size and reader.spec.image_shape == (36, 52, 3)
        dataset = LazyDataset(reader, decode="auto")
        assert not dataset.is_ragged and dataset.sample_shape == (36, 52, 3)
        out = np.empty((len(KINDS), 36, 52, 3), dtype=np.uint8)
        batch = dataset.get_batch(range(len(KINDS)), out=out)
        assert np.shares_memory(batch.images, out)
        np.testing.assert_array_equal(batch.images, np.stack([pil_rgb(d) for d in source.data]))
        # With the input shape known, even ResizeShorter says what it returns.
        shorter = LazyDataset(reader, decode="auto", transform=ResizeShorter(18))
        assert shorter.sample_shape == (18, 26, 3)
        assert shorter.get_batch([0, 1]).images.shape == (2, 18, 26, 3)


def test_simplejpeg_on_a_mixed_set_is_refused(roots):
    with open_dataset(roots["lmdb"]) as reader:
        with pytest.raises(ValueError, match="simplejpeg decodes JPEG only.*mixed.*decode='auto'"):
            LazyDataset(reader, decode="simplejpeg")
        with pytest.raises(ValueError, match=r"Resize\(height=8, width=8\) works on decoded"):
            LazyDataset(reader, transform=Resize(8, 8))


def test_a_ragged_batch_refuses_out_and_pads_with_collate_padded(roots, source):
    with open_dataset(roots["parquet"]) as reader:
        dataset = LazyDataset(reader, decode="auto")
        with pytest.raises(ValueError, match="differ in size.*Resize"):
            dataset.get_batch([0, 1], out=np.empty((2, 64, 64, 3), np.uint8))
        batch = dataset.get_batch([3, 4, 1])
        padded, shapes = collate_padded(batch.images)
        assert shapes.tolist() == [list(source.shape(i)) for i in (3, 4, 1)]
        for k, i in enumerate((3, 4, 1)):
            h, w, _ = source.shape(i)
            np.testing.assert_array_equal(padded[k, :h, :w], decoded(source.data[i], "auto"))


# -- transforms -----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lazy", "preloaded"])
@pytest.mark.parametrize("format_name", ENCODED_FORMATS)
def test_resize_stacks_every_image_into_out(roots, source, format_name, kind):
    order = [4, 0, 11, 3]
    with open_dataset(roots[format_name]) as reader:
        dataset = open_kind(kind, reader, decode="auto", transform=Resize(24, 40))
        assert dataset.sample_shape == (24, 40, 3)
        out = np.zeros((6, 24, 40, 3), dtype=np.uint8)
        batch = dataset.get_batch(order, out=out)
        assert np.shares_memory(batch.images, out) and batch.images.shape == (4, 24, 40, 3)
        np.testing.assert_array_equal(batch.images, resized(source, order, 24, 40))
        assert batch.labels.tolist() == source.labels[order].tolist()
        fresh = dataset.get_batch(order)
        np.testing.assert_array_equal(fresh.images, batch.images)


def test_resize_shorter_then_center_crop_is_the_classic_eval_transform(roots, source):
    transform = Compose(ResizeShorter(48), CenterCrop(44, 44))
    with open_dataset(roots["rawfiles"]) as reader:
        dataset = LazyDataset(reader, decode="pil", transform=transform)
        assert dataset.sample_shape == (44, 44, 3)
        batch = dataset.get_batch(range(NUM_SAMPLES))
        assert batch.images.shape == (NUM_SAMPLES, 44, 44, 3)
        for i in range(NUM_SAMPLES):
            h, w, _ = source.shape(i)
            # torchvision's arithmetic: the longer side truncated, the crop corner rounded.
            new_h, new_w = (48, int(48 * w / h)) if h <= w else (int(48 * h / w), 48)
            image = pil_resize(pil_rgb(source.data[i]), new_h, new_w)
            top, left = int(round((new_h - 44) / 2)), int(round((new_w - 44) / 2))
            np.testing.assert_array_equal(batch.images[i], image[top : top + 44, left : left + 44])


def test_transform_shapes_and_rounding():
    assert ResizeShorter(256).resized_size(300, 400) == (256, 341)
    assert ResizeShorter(256).resized_size(400, 300) == (341, 256)
    assert ResizeShorter(256).resized_size(256, 256) == (256, 256)
    assert ResizeShorter(8).output_shape(None, 3) is None
    assert ResizeShorter(8).output_shape((16, 32, 3), 3) == (8, 16, 3)
    assert Resize(5, 7).output_shape(None, 3) == (5, 7, 3)
    classic = Compose(ResizeShorter(256), CenterCrop(224, 224))
    assert classic.output_shape(None, 3) == (224, 224, 3)
    assert Compose(ResizeShorter(8)).output_shape(None, 3) is None
    assert Compose(Resize(9, 9), np.ascontiguousarray).output_shape(None, 3) is None
    image = np.arange(7 * 8 * 1, dtype=np.uint8).reshape(7, 8, 1)
    # Margins of 3 rows and 5 columns: round(1.5) = 2 and round(2.5) = 2, as torchvision.
    np.testing.assert_array_equal(CenterCrop(4, 3)(image), image[2:6, 2:5])
    grey = Resize(3, 4)(image)
    assert grey.shape == (3, 4, 1)
    np.testing.assert_array_equal(grey[:, :, 0], pil_resize(image[:, :, 0], 3, 4))
    four = np.random.default_rng(0).integers(0, 256, (6, 5, 4), dtype=np.uint8)
    by_band = Resize(4, 3)(four)
    for c in range(4):  # band by band: no alpha premultiplication of the 4th
        np.testing.assert_array_equal(by_band[:, :, c], pil_resize(four[:, :, c], 4, 3))


def test_transforms_refuse_what_they_cannot_take():
    with pytest.raises(ImageTooSmallError, match=r"CenterCrop\(50, 30\) needs images of at "
                       r"least 50x30 \(height x width\), got one of 40x64"):
        CenterCrop(50, 30)(np.zeros((40, 64, 3), np.uint8))
    with pytest.raises(TypeError, match="decoded.*got bytes.*decode='auto'"):
        Resize(4, 4)(b"\xff\xd8\xff")
    with pytest.raises(ValueError, match="height must be a positive integer"):
        Resize(0, 4)
    with pytest.raises(ValueError, match="size must be a positive integer"):
        ResizeShorter(2.5)
    with pytest.raises(TypeError, match="Compose takes callables"):
        Compose(Resize(2, 2), 3)


def test_a_crop_too_large_names_the_sizes_and_the_sample(roots, source):
    small = min(range(NUM_SAMPLES), key=lambda i: source.shape(i)[0])
    h, w, _ = source.shape(small)
    crop = CenterCrop(h + 1, 8)
    with open_dataset(roots["lmdb"]) as reader:
        dataset = LazyDataset(reader, decode="auto", transform=crop)
        message = f"at least {h + 1}x8.*got one of {h}x{w}"
        with pytest.raises(ImageTooSmallError, match=message) as err:
            dataset.get_batch([small])
        assert any(f"to sample {small} " in note for note in err.value.__notes__)


def test_transforms_pickle_and_compare_by_value():
    classic = Compose(ResizeShorter(256), CenterCrop(224, 224))
    for transform in (classic, Resize(224, 224), ResizeShorter(3), CenterCrop(1, 2)):
        clone = pickle.loads(pickle.dumps(transform))
        assert clone == transform and repr(clone) == repr(transform)
    assert repr(classic) == "Compose(ResizeShorter(size=256), CenterCrop(height=224, width=224))"


# -- prefetchers -----------------------------------------------------------------------------
def our_children() -> set[int]:
    """Child processes, without multiprocessing's long-lived helpers."""
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            cmdline = ""
        if "resource_tracker" not in cmdline and "forkserver" not in cmdline:
            pids.add(child.pid)
    return pids


def still_running(pids, timeout: float = 10.0) -> list[int]:
    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transform", [None, Resize(24, 40)], ids=["ragged", "resized"])
def test_thread_prefetcher_keeps_the_sampler_order(roots, source, transform):
    with open_dataset(roots["tfrecord"]) as reader:
        dataset = PreloadedDataset(reader, decode="auto", transform=transform, progress=False)
        batches = BatchSampler(ShuffleSampler(len(dataset), seed=3), 5)
        with ThreadPrefetcher(dataset, batches, workers=2, depth=2, copy=True) as prefetcher:
            for epoch in (0, 1):
                prefetcher.set_epoch(epoch)
                got = list(prefetcher)
                want_order = [idx.tolist() for idx in batches]
                assert [b.indices.tolist() for b in got] == want_order
                for batch, order in zip(got, want_order, strict=True):
                    assert batch.labels.tolist() == source.labels[order].tolist()
                    if transform is None:
                        assert [img.shape for img in batch.images] == [
                            source.shape(i) for i in order
                        ]
                        for img, i in zip(batch.images, order, strict=True):
                            np.testing.assert_array_equal(img, decoded(source.data[i], "auto"))
                    else:
                        np.testing.assert_array_equal(
                            batch.images, resized(source, order, 24, 40)
                        )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("kind", ["lazy", "preloaded"])
def test_process_prefetcher_decodes_and_resizes_in_its_workers(
    roots, source, kind, start_method
):
    transform = Compose(ResizeShorter(MIN_SIDE), CenterCrop(32, 36))
    with open_dataset(roots["hdf5"]) as reader:
        dataset = open_kind(kind, reader, decode="auto", transform=transform)
        want = {i: dataset[i][0] for i in range(NUM_SAMPLES)}  # checked against PIL above
        batches = BatchSampler(ShuffleSampler(NUM_SAMPLES, seed=5), 4)
        before = our_children()
        with ProcessPrefetcher(
            dataset, batches, workers=2, depth=2, start_method=start_method, copy=True
        ) as prefetcher:
            for epoch in (0, 1):
                prefetcher.set_epoch(epoch)
                got = list(prefetcher)
                want_order = [idx.tolist() for idx in batches]
                assert [b.indices.tolist() for b in got] == want_order
                for batch, order in zip(got, want_order, strict=True):
                    assert batch.images.shape == (len(order), 32, 36, 3)
                    assert batch.labels.tolist() == source.labels[order].tolist()
                    np.testing.assert_array_equal(batch.images, np.stack([want[i] for i in order]))
            pids, segment = prefetcher.pids, Path("/dev/shm") / prefetcher.shm_name
        assert still_running(pids) == []
        assert not segment.exists()
        assert our_children() - before == set()


@pytest.mark.timeout(60)
def test_process_prefetcher_refuses_ragged_batches(roots):
    with open_dataset(roots["lmdb"]) as reader:
        dataset = LazyDataset(reader, decode="auto")
        before = our_children()
        with pytest.raises(ValueError, match="differ in size.*Resize.*ThreadPrefetcher"):
            ProcessPrefetcher(dataset, BatchSampler(SequentialSampler(len(dataset)), 4))
        assert our_children() - before == set()


# -- frameworks ------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_dataloader_resizes_in_its_workers(roots, source, num_workers):
    import torch

    from storebench.loaders.torch_adapter import torch_dataloader

    with open_dataset(roots["parquet"]) as reader:
        dataset = PreloadedDataset(reader, decode="auto", transform=Resize(24, 40), progress=False)
        sampler = ShuffleSampler(NUM_SAMPLES, seed=8)
        options = {"multiprocessing_context": "fork"} if num_workers else {}
        loader = torch_dataloader(
            dataset, batch_size=5, sampler=sampler, num_workers=num_workers, **options
        )
        order = [idx.tolist() for idx in BatchSampler(sampler, 5)]
        got = list(loader)
        assert len(got) == len(order)
        for (images, labels), indices in zip(got, order, strict=True):
            assert isinstance(images, torch.Tensor) and images.dtype == torch.uint8
            np.testing.assert_array_equal(images.numpy(), resized(source, indices, 24, 40))
            assert labels.tolist() == source.labels[indices].tolist()


@pytest.mark.timeout(120)
def test_torch_dataloader_hands_ragged_batches_as_lists_of_tensors(roots, source):
    import torch

    from storebench.loaders.torch_adapter import torch_dataloader

    with open_dataset(roots["lmdb"]) as reader:
        loader = torch_dataloader(
            LazyDataset(reader, decode="auto"),
            batch_size=4,
            num_workers=2,
            multiprocessing_context="fork",
        )
        seen = 0
        for images, labels in loader:
            assert isinstance(images, list) and len(images) == len(labels)
            for k, image in enumerate(images):
                i = seen + k
                assert isinstance(image, torch.Tensor) and tuple(image.shape) == source.shape(i)
                np.testing.assert_array_equal(image.numpy(), decoded(source.data[i], "auto"))
            assert labels.tolist() == source.labels[seen : seen + len(labels)].tolist()
            seen += len(labels)
        assert seen == NUM_SAMPLES


@pytest.mark.timeout(120)
def test_tfrecord_pipeline_decodes_mixed_files_and_resizes(roots, source):
    import tensorflow as tf

    from storebench.loaders.tf_adapter import tfrecord_pipeline

    root = roots["tfrecord"]
    with pytest.raises(ValueError, match="differ in size.*resize="):
        tfrecord_pipeline(root, batch_size=4)
    got = list(tfrecord_pipeline(root, batch_size=4, resize=(24, 40)))
    images = np.concatenate([batch.numpy() for batch, _ in got])
    labels = np.concatenate([lab.numpy() for _, lab in got])
    assert images.shape == (NUM_SAMPLES, 24, 40, 3) and images.dtype == np.uint8
    assert labels.tolist() == source.labels.tolist()
    # TensorFlow decodes every mode to Pillow's pixels (JPEG with the accurate IDCT); its
    # resize is its own, so the reference resizes Pillow's decode with tf.image.resize.
    for i in range(NUM_SAMPLES):
        scaled = tf.image.resize(pil_rgb(source.data[i]), (24, 40), antialias=False)
        want = np.clip(np.round(scaled.numpy()), 0, 255).astype(np.uint8)
        np.testing.assert_array_equal(images[i], want, err_msg=source.modes[i])
    encoded = np.concatenate(
        [batch.numpy() for batch, _ in tfrecord_pipeline(root, batch_size=7, decode=False)]
    )
    assert [bytes(x) for x in encoded] == source.data


@pytest.mark.timeout(120)
def test_tfrecord_pipeline_decodes_a_mixed_set_of_one_size_without_resize(same_size):
    from storebench.loaders.tf_adapter import tfrecord_pipeline

    root, source = same_size
    images = np.concatenate([b.numpy() for b, _ in tfrecord_pipeline(root, batch_size=4)])
    np.testing.assert_array_equal(images, np.stack([pil_rgb(d) for d in source.data]))
