"""The crop-window decode (``storebench._jpegwindow``) and the C resize (``storebench._resize``)
behind ``decode="window"``: the pixels they deliver against the full decode and Pillow, the
errors they raise, and what they do with damaged and hostile JPEGs."""

from __future__ import annotations

import io
import json
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import simplejpeg
from hostile import python_bounded
from PIL import Image

from data_gen.photo import photo_sample
from data_gen.spec import imagenet_like
from storebench import _resize
from storebench.formats import CorruptSampleError, open_dataset
from storebench.importer import import_images
from storebench.loaders import LazyDataset, RandomResizedCropFlip
from storebench.loaders.train_transform import jpeg_header

_jpegwindow = pytest.importorskip("storebench._jpegwindow")

PHOTO, _ = imagenet_like(64)


def photos(count: int) -> list[bytes]:
    return [photo_sample(PHOTO, index)[0] for index in range(count)]


def encoded(pixels: np.ndarray, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", **options)
    return buffer.getvalue()


def textured(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    """Smooth colour and fine noise: chroma detail that subsampling and its upsampling
    change, so that an edge handled unlike the full decode shows."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([(xx * 255 // max(width - 1, 1)), (yy * 255 // max(height - 1, 1)),
                     ((xx + yy) * 7) % 256], axis=-1)[:, :, :channels]
    noise = rng.integers(-40, 40, (height, width, channels))
    return np.clip(base + noise, 0, 255).astype(np.uint8).squeeze()


# -- the C resize -------------------------------------------------------------------------
def pillow_vertical_first(image: np.ndarray, box, size: tuple[int, int]) -> np.ndarray:
    """Pillow's bilinear resize of ``box`` one axis at a time, rows first."""
    left, top, right, bottom = box
    height, width = image.shape[:2]
    pil = Image.fromarray(image.squeeze(-1) if image.shape[2] == 1 else image)
    # Rows first: the whole width (no horizontal pass), the box's rows to the output height.
    tall = pil.resize((width, size[0]), Image.Resampling.BILINEAR, box=(0, top, width, bottom))
    out = tall.resize((size[1], size[0]), Image.Resampling.BILINEAR,
                      box=(left, 0, right, size[0]))
    return np.asarray(out).reshape(size[0], size[1], -1)


def test_the_resize_is_pillow_s_arithmetic_rows_first_and_within_a_level_of_pillow():
    rng = np.random.default_rng(7)
    for trial in range(300):
        height, width = (int(x) for x in rng.integers(2, 400, 2))
        channels = int(rng.choice([1, 3]))
        image = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
        left, top = rng.uniform(0, width - 1), rng.uniform(0, height - 1)
        box = (left, top, rng.uniform(left + 0.5, width), rng.uniform(top + 0.5, height))
        if trial % 2:
            box = tuple(float(int(v)) for v in box[:2]) + (
                float(max(int(box[0]) + 1, int(box[2]))), float(max(int(box[1]) + 1,
                                                                     int(box[3]))))
        size = (int(rng.integers(1, 300)), int(rng.integers(1, 300)))
        out = np.empty((*size, channels), np.uint8)
        _resize.resize_into(image, box, out)
        np.testing.assert_array_equal(out, pillow_vertical_first(image, box, size),
                                      err_msg=f"{(height, width)} {box} {size}")
        pil = np.asarray(Image.fromarray(image.squeeze(-1) if channels == 1 else image).resize(
            (size[1], size[0]), Image.Resampling.BILINEAR, box=box)).reshape(*size, -1)
        assert np.abs(out.astype(int) - pil).max() <= 1
        flipped = np.empty_like(out)
        _resize.resize_into(image, box, flipped, flip=True)
        np.testing.assert_array_equal(flipped, out[:, ::-1])


def plain_bilinear(image: np.ndarray, size: int) -> np.ndarray:
    """Two taps a direction at half-pixel centres, clamped at the edges, in float:
    tf.image.resize(antialias=False)'s sampling."""
    def axis(n_in: int):
        centre = (np.arange(size) + 0.5) * n_in / size - 0.5
        low = np.clip(np.floor(centre), 0, n_in - 1).astype(int)
        high = np.clip(low + 1, 0, n_in - 1)
        frac = np.clip(centre - low, 0, 1)
        return low, high, frac
    ylo, yhi, fy = axis(image.shape[0])
    xlo, xhi, fx = axis(image.shape[1])
    rows = image[ylo] * (1 - fy)[:, None, None] + image[yhi] * fy[:, None, None]
    return rows[:, xlo] * (1 - fx)[None, :, None] + rows[:, xhi] * fx[None, :, None]


def test_the_plain_filter_samples_two_pixels_a_direction():
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (500, 380, 3), dtype=np.uint8)
    plain, antialiased = (np.empty((224, 224, 3), np.uint8) for _ in range(2))
    _resize.resize_into(image, (0, 0, 380, 500), plain, antialias=False)
    _resize.resize_into(image, (0, 0, 380, 500), antialiased)
    assert np.abs(plain.astype(float) - plain_bilinear(image, 224)).max() <= 1.0 + 1e-9
    # Downscaled noise: the antialiased filter averages it away, two taps do not.
    assert plain.std() > antialiased.std() * 1.2


@pytest.mark.parametrize("src, box, out, message", [
    (np.zeros((4, 4), np.uint8), (0, 0, 4, 4), np.zeros((2, 2, 1), np.uint8),
     "src must be a uint8 (height, width, channels) array"),
    (np.zeros((4, 4, 3), np.float32), (0, 0, 4, 4), np.zeros((2, 2, 3), np.uint8),
     "src must be a uint8"),
    (np.zeros((4, 4, 3), np.uint8), (0, 0, 5, 4), np.zeros((2, 2, 3), np.uint8),
     "box (0, 0, 5, 4) must lie inside the 4 x 4 image and be non-empty"),
    (np.zeros((4, 4, 3), np.uint8), (2, 0, 2, 4), np.zeros((2, 2, 3), np.uint8),
     "box (2, 0, 2, 4) must lie inside the 4 x 4 image and be non-empty"),
    (np.zeros((4, 4, 3), np.uint8), (0, 0, 4, 4), np.zeros((2, 2, 1), np.uint8),
     "src has 3 channels, out 1"),
    (np.zeros((4, 4, 3), np.uint8)[:, ::2], (0, 0, 2, 4), np.zeros((2, 2, 3), np.uint8),
     "src must hold each row's pixels packed"),
    (np.zeros((4, 4, 3), np.uint8), (0, 0, 4, 4), np.zeros((2, 2, 3), np.uint8)[::-1],
     "out must hold each row's pixels packed"),
])
def test_the_resize_refuses_what_it_cannot_read_or_write(src, box, out, message):
    with pytest.raises(ValueError, match=r"^" + re.escape(message)):
        _resize.resize_into(src, box, out)


def test_the_resize_refuses_a_read_only_out():
    out = np.zeros((2, 2, 3), np.uint8)
    out.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        _resize.resize_into(np.zeros((4, 4, 3), np.uint8), (0, 0, 4, 4), out)


# -- the window decode ---------------------------------------------------------------------
def windows(height: int, width: int, rng: np.random.Generator, count: int):
    """Windows at every kind of place: corners, edges, one pixel, the whole image, and
    random ones."""
    fixed = [(0, 0, height, width), (0, 0, 1, 1), (height - 1, width - 1, height, width),
             (0, width - 7, 9, width), (height - 9, 0, height, 7), (3, 5, 4, 6)]
    for _ in range(count):
        top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
        fixed.append((top, left, int(rng.integers(top + 1, height + 1)),
                      int(rng.integers(left + 1, width + 1))))
    return fixed


def full_decode(data: bytes, colorspace: str = "RGB") -> np.ndarray:
    decoded = simplejpeg.decode_jpeg(data, colorspace=colorspace)
    return decoded.reshape(*decoded.shape[:2], -1)


def window_decode(data: bytes, window, channels: int = 3, scale_denom: int = 1) -> np.ndarray:
    top, left, bottom, right = window
    out = np.empty((bottom - top, right - left, channels), np.uint8)
    _jpegwindow.decode_window_into(data, window, out, scale_denom=scale_denom)
    return out


@pytest.mark.parametrize("kind", ["imagenet-like", "4:4:4", "4:2:2", "progressive",
                                  "greyscale", "grey as RGB", "odd size", "restart markers"])
def test_a_window_holds_the_full_decode_s_pixels(kind):
    rng = np.random.default_rng(11)
    if kind == "imagenet-like":
        samples = [(data, 3) for data in photos(6)]
    else:
        pixels = textured(203, 157) if kind == "odd size" else textured(240, 320)
        options = {"4:4:4": {"subsampling": 0}, "4:2:2": {"subsampling": 1},
                   "progressive": {"progressive": True},
                   "restart markers": {"restart_marker_blocks": 3}}.get(kind, {})
        if kind.startswith("grey"):
            pixels = textured(240, 320, channels=1)
        data = encoded(pixels, quality=90, **options)
        if kind == "restart markers":
            assert b"\xff\xdd" in data  # a DRI segment
        samples = [(data, 1 if kind == "greyscale" else 3)]
    if kind == "progressive":
        assert jpeg_header(samples[0][0])[3] is True
    for data, channels in samples:
        full = full_decode(data, "GRAY" if channels == 1 else "RGB")
        for window in windows(*full.shape[:2], rng, 25):
            top, left, bottom, right = window
            np.testing.assert_array_equal(window_decode(data, window, channels),
                                          full[top:bottom, left:right],
                                          err_msg=f"{kind} {window}")


def test_a_scaled_window_is_the_scaled_decode_s():
    data = photos(1)[0]
    for denom in (2, 4, 8):
        height, width = jpeg_header(data)[:2]
        scaled = simplejpeg.decode_jpeg(data, colorspace="RGB",
                                        min_height=-(-height // denom),
                                        min_width=-(-width // denom))
        assert scaled.shape[:2] == (-(-height // denom), -(-width // denom))
        window = (3, 2, scaled.shape[0] - 1, scaled.shape[1] - 3)
        np.testing.assert_array_equal(window_decode(data, window, scale_denom=denom),
                                      scaled[3:-1, 2:-3])


def test_the_training_crop_from_a_window_is_the_crop_from_the_full_decode():
    for transform in (RandomResizedCropFlip(seed=2), RandomResizedCropFlip(seed=2,
                                                                           filter="plain"),
                      RandomResizedCropFlip(seed=2, resampler="pillow")):
        for index, data in enumerate(photos(12)):
            for epoch in (0, 1):
                want = transform(full_decode(data), index=index, epoch=epoch)
                got = transform.decode_window(data, index=index, epoch=epoch)
                np.testing.assert_array_equal(got, want, err_msg=f"{transform} {index}")
                into = np.zeros((224, 224, 3), np.uint8)
                assert transform.decode_window(data, index=index, epoch=epoch,
                                               out=into) is into
                np.testing.assert_array_equal(into, want)


def test_a_dct_scaled_window_stays_close_and_applies_to_large_crops_only():
    transform = RandomResizedCropFlip(seed=5)
    applied, worst = 0, np.inf
    for index, data in enumerate(photos(40)):
        height, width = jpeg_header(data)[:2]
        p, denom, _, _ = transform.window_plan(height, width, index=index, dct_scale=True)
        assert denom == 1 or (p.height // denom >= 224 and p.width // denom >= 224)
        applied += denom > 1
        if denom > 1:
            full = transform(full_decode(data), index=index).astype(float)
            scaled = transform.decode_window(data, index=index, dct_scale=True)
            mse = np.mean((full - scaled) ** 2)
            worst = min(worst, 10 * np.log10(255**2 / mse) if mse else np.inf)
    # ImageNet-like crops rarely span 448 pixels both ways: the scale applies to few.
    assert applied < 40 // 2
    assert applied == 0 or worst > 25.0


@pytest.mark.parametrize("window, shape, message", [
    ((0, 0, 2000, 10), (2000, 10, 3), "window [0, 2000) x [0, 10) is not inside the"),
    ((-1, 0, 4, 4), (5, 4, 3), "window [-1, 4) x [0, 4) is not inside the"),
    ((0, 0, 4, 4), (5, 4, 3), "out must be (4, 4, 1 or 3), got (5, 4, 3)"),
    ((5, 5, 5, 9), (1, 4, 3), "out must be (0, 4, 1 or 3)"),
])
def test_a_window_outside_the_image_is_refused(window, shape, message):
    data = photos(1)[0]
    with pytest.raises(ValueError, match=re.escape(message)):
        _jpegwindow.decode_window_into(data, window, np.empty(shape, np.uint8))


def test_damaged_and_foreign_data_raise_value_errors_naming_the_cause():
    data = photos(1)[0]
    out = np.empty((8, 8, 3), np.uint8)
    for bad, message in ((b"", "Empty input file"), (b"not a jpeg at all", "Not a JPEG"),
                         (data[:200], "Premature end of JPEG file")):
        with pytest.raises(ValueError, match=message):
            _jpegwindow.decode_window_into(bad, (0, 0, 8, 8), out)
    height, _ = jpeg_header(data)[:2]
    with pytest.raises(ValueError, match="Premature end of JPEG file"):
        # The window's rows lie past where the data ends.
        _jpegwindow.decode_window_into(data[: len(data) // 3],
                                       (height - 8, 0, height, 8), out)
    # A window above where the data ends is read whole: its pixels are the image's own.
    _jpegwindow.decode_window_into(data[: len(data) // 3], (0, 0, 8, 8), out)
    np.testing.assert_array_equal(out, full_decode(data)[:8, :8])
    buffer = io.BytesIO()
    Image.new("CMYK", (16, 16), (10, 20, 30, 40)).save(buffer, format="JPEG")
    with pytest.raises(ValueError, match="CMYK and YCCK JPEGs are not decoded here"):
        _jpegwindow.decode_window_into(buffer.getvalue(), (0, 0, 8, 8), out)


def test_a_header_claiming_more_pixels_than_the_cap_is_refused_before_allocating():
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buffer, format="JPEG")
    data = bytearray(buffer.getvalue())
    sof = data.find(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, 65000, 65000)
    # In a bounded child: unchecked, the decode would ask for gigabytes.
    result = python_bounded(
        "import numpy as np\n"
        "from storebench import _jpegwindow\n"
        "from storebench.loaders import RandomResizedCropFlip\n"
        "from storebench.formats import DatasetError\n"
        f"data = {bytes(data)!r}\n"
        "try:\n"
        "    _jpegwindow.decode_window_into(data, (64000, 64000, 64008, 64008),\n"
        "                                   np.empty((8, 8, 3), np.uint8), max_pixels=10**8)\n"
        "except ValueError as err:\n"
        "    print('refused:', err)\n"
        "try:\n"
        "    RandomResizedCropFlip().decode_window(data, index=0)\n"
        "except DatasetError as err:\n"
        "    print('refused:', err)\n")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ("refused: the header claims 65000 x 65000 pixels, over the cap of "
                        "100000000"), lines
    assert "exceeds the cap" in lines[1], lines


# -- damaged JPEGs: no crash, no hang -----------------------------------------------------
DAMAGE_CHILD = r"""
import json, sys
import numpy as np
from storebench.loaders import RandomResizedCropFlip
cases = json.loads(sys.stdin.read())
transform = RandomResizedCropFlip(seed=1)
for index, hexdata in cases:
    data = bytes.fromhex(hexdata)
    try:
        image = transform.decode_window(data, index=index)
        print(json.dumps(["ok", image.shape, image.tobytes().hex()[:64]]), flush=True)
    except ValueError as err:
        print(json.dumps(["error", type(err).__name__, str(err)]), flush=True)
    except Exception as err:
        print(json.dumps(["other", type(err).__name__, str(err)]), flush=True)
"""


def damaged_jpegs(count: int, seed: int = 0) -> list[tuple[int, bytes]]:
    """Seeded damage to ImageNet-like JPEGs: flipped bytes, zeroed runs, truncation,
    appended garbage, and edits of the header's segments."""
    rng = np.random.default_rng(seed)
    originals = photos(8)
    out = []
    for n in range(count):
        data = bytearray(originals[n % len(originals)])
        kind = n % 5
        if kind == 0:
            for at in rng.integers(0, len(data), int(rng.integers(1, 20))):
                data[at] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:
            at, length = int(rng.integers(0, len(data) - 64)), int(rng.integers(1, 64))
            data[at: at + length] = bytes(length)
        elif kind == 2:
            data = data[: int(rng.integers(2, len(data)))]
        elif kind == 3:
            data += rng.integers(0, 256, int(rng.integers(1, 500)), dtype=np.uint8).tobytes()
        else:  # within the first 600 bytes: quantisation and Huffman tables, SOF, SOS
            for at in rng.integers(2, 600, int(rng.integers(1, 6))):
                data[at] = int(rng.integers(0, 256))
        out.append((n, bytes(data)))
    return out


def test_damaged_jpegs_never_crash_or_hang_the_window_decode():
    cases = damaged_jpegs(250)
    outcomes = []
    for first in range(0, len(cases), 50):  # a crash would name its chunk
        chunk = [(index, data.hex()) for index, data in cases[first: first + 50]]
        try:
            result = subprocess.run([sys.executable, "-c", DAMAGE_CHILD],
                                    input=json.dumps(chunk), capture_output=True, text=True,
                                    timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"a decode of damaged JPEGs {first}..{first + 49} hung")
        assert result.returncode == 0, (first, result.returncode, result.stderr[-2000:])
        outcomes += [json.loads(line) for line in result.stdout.splitlines()]
    assert len(outcomes) == len(cases)
    assert [o for o in outcomes if o[0] == "other"] == []
    assert all(o[1] == [224, 224, 3] for o in outcomes if o[0] == "ok")
    # Damage is caught by libjpeg (an error) where it breaks the stream's structure; the
    # rest decode, and the formats' per-sample checksums catch what changed the bytes.
    errors = sum(o[0] == "error" for o in outcomes)
    assert 0 < errors < len(cases)


# -- through the dataset -----------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed_set(tmp_path_factory):
    """An imported folder of JPEGs (colour, greyscale, progressive, CMYK) and PNGs."""
    root = tmp_path_factory.mktemp("mixed")
    folder = root / "images" / "a"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for n in range(12):
        pixels = textured(int(rng.integers(150, 400)), int(rng.integers(150, 400)), seed=n)
        image = Image.fromarray(pixels)
        if n % 6 == 1:
            image = image.convert("L")
        if n % 6 == 2:
            image = image.convert("CMYK")
        options = {"progressive": True} if n % 6 == 3 else {}
        suffix = ".png" if n % 6 == 4 else ".jpg"
        image.save(folder / f"{n:02d}{suffix}", **options)
    out = root / "set"
    import_images(root / "images", out, formats=("lmdb",), progress=False)
    return out / "lmdb-mixed"


def test_decode_window_delivers_the_full_decode_s_crops_for_every_kind_of_image(mixed_set):
    reader = open_dataset(mixed_set)
    transform = RandomResizedCropFlip(seed=3)
    with LazyDataset(reader, decode="auto", transform=transform,
                     output_shape=(224, 224, 3)) as full, \
            LazyDataset(reader, decode="window", transform=transform,
                        output_shape=(224, 224, 3)) as window:
        for epoch in (0, 1):
            full.set_epoch(epoch)
            window.set_epoch(epoch)
            indices = list(range(len(reader)))[::-1]
            want = full.get_batch(indices).images
            got = window.get_batch(indices).images
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(window[5][0], want[len(indices) - 6])
            out = np.zeros_like(want)
            assert np.shares_memory(window.get_batch(indices, out=out).images, out)
            np.testing.assert_array_equal(out, want)


def test_decode_window_needs_the_training_transform(mixed_set):
    reader = open_dataset(mixed_set)
    with pytest.raises(ValueError, match="decode='window' decodes only the training crop's "
                                         "window: it takes transform=RandomResizedCropFlip"):
        LazyDataset(reader, decode="window")


def test_a_damaged_sample_names_its_file_and_index(tmp_path):
    folder = tmp_path / "images" / "a"
    folder.mkdir(parents=True)
    for n in range(2):
        (folder / f"0{n}.jpg").write_bytes(photo_sample(PHOTO, n)[0])
    import_images(tmp_path / "images", tmp_path / "set", formats=("rawfiles",),
                  progress=False)
    reader = open_dataset(tmp_path / "set" / "rawfiles-jpeg")
    data = bytes(reader[1][0])
    # The image ends where its scan begins: EOI right after the SOS header.
    sos = data.find(b"\xff\xda")
    damaged = data[: sos + 2 + int.from_bytes(data[sos + 2: sos + 4], "big")] + b"\xff\xd9"
    with LazyDataset(reader, decode="window", transform=RandomResizedCropFlip(),
                     output_shape=(224, 224, 3)) as dataset:
        assert dataset[1][0].shape == (224, 224, 3)
        with pytest.raises(CorruptSampleError) as caught:
            dataset._decode_window(damaged, 1, None)
    message = str(caught.value)
    assert str(reader._locate(1)) in message and "sample 1" in message
    assert "cannot decode jpeg: Corrupt JPEG data: premature end of data segment" in message
