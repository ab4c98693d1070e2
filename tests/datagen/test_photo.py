"""The ImageNet-like set: a pure function of (spec, index), within its documented bands."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image

import data_gen
from data_gen import PhotoSpec, VariableShapeError
from data_gen.describe import TABLE_BEGIN, TABLE_END, describe, quantile_table
from data_gen.photo import GREYSCALE_FRACTION, _draw_start, resize_to_training
from storebench.formats.specs import fixed_size, spec_from_dict

DOC = Path(__file__).resolve().parents[2] / "docs" / "imagenet-like.md"
SMALL = data_gen.get_profile("small").spec_for("jpeg", "imagenet")


@pytest.fixture(scope="module")
def measured():
    """The first 300 images of the small profile's set, measured (as the doc table is)."""
    return describe(SMALL, 300)


def test_sizes_and_bytes_fall_in_the_documented_bands(measured):
    assert len(measured.widths) == 300
    assert 400 <= np.median(measured.widths) <= 500
    assert 330 <= np.median(measured.heights) <= 400
    p5, p95 = np.percentile(measured.shorter, [5, 95])
    assert p95 >= 2 * p5
    assert 90_000 <= measured.sizes.mean() <= 130_000
    assert 0.5 <= measured.bytes_per_pixel.mean() <= 0.8
    # Sizes vary: not one shape, and both orientations.
    assert len(set(zip(measured.widths, measured.heights, strict=True))) > 100
    assert (measured.heights > measured.widths).any() and (measured.widths > measured.heights).any()


def test_the_doc_table_is_the_measured_one(measured):
    page = DOC.read_text(encoding="utf-8")
    body = page.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0]
    assert body.strip() == quantile_table(measured).strip(), (
        "docs/imagenet-like.md is stale: run storebench describe-set --write "
        "docs/imagenet-like.md")


def test_greyscale_share_and_what_a_greyscale_image_is():
    flags = np.array([_draw_start(SMALL.seed, i)[2] for i in range(4000)])
    assert abs(flags.mean() - GREYSCALE_FRACTION) < 0.006
    grey = int(np.flatnonzero(flags)[0])
    colour = int(np.flatnonzero(~flags)[0])
    data, _ = data_gen.sample(SMALL, grey)
    assert simplejpeg.decode_jpeg_header(data)[2] == "Gray"
    assert Image.open(io.BytesIO(data)).mode == "L"
    assert simplejpeg.decode_jpeg_header(data_gen.sample(SMALL, colour)[0])[2] == "YCbCr"
    # Decoded as RGB, as a training pipeline reads it: three equal channels.
    rgb = simplejpeg.decode_jpeg(data, colorspace="RGB")
    assert rgb.shape[2] == 3 and (rgb[..., 0] == rgb[..., 1]).all()


def test_same_bytes_for_the_same_spec_and_index():
    raw = PhotoSpec(8, encoding="raw", height=224, width=224, seed=SMALL.seed)
    jpeg = PhotoSpec(8, seed=SMALL.seed)
    forward = [data_gen.sample(jpeg, i)[0] for i in range(8)]
    backward = [data_gen.sample(jpeg, i)[0] for i in reversed(range(8))][::-1]
    parallel = [image for image, _ in data_gen.generate(jpeg, workers=2, chunk_size=3)]
    assert forward == backward == parallel
    assert len(set(forward)) == 8  # every image its own
    # The same image whatever the set's length: the profiles share their first images.
    assert data_gen.sample(SMALL, 5) == data_gen.sample(jpeg, 5)
    assert data_gen.sample(PhotoSpec(8, seed=SMALL.seed + 1), 5)[0] != forward[5]
    code = (
        f"import hashlib, data_gen; spec = data_gen.PhotoSpec(8, seed={SMALL.seed});"
        "h = hashlib.sha256();"
        "[h.update(data_gen.sample(spec, i)[0]) for i in range(8)]; print(h.hexdigest())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == hashlib.sha256(b"".join(forward)).hexdigest()
    pixels, label = data_gen.sample(raw, 3)
    assert label == data_gen.sample(jpeg, 3)[1]
    np.testing.assert_array_equal(pixels, resize_to_training(forward[3], 224, 224))


def test_the_raw_copy_is_the_decoded_image_resized_and_centre_cropped():
    data, _ = data_gen.sample(SMALL, 0)
    image = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = image.size
    scale = 224 / min(w, h)
    new_w, new_h = max(224, int(w * scale)), max(224, int(h * scale))
    resized = np.asarray(image.resize((new_w, new_h), Image.Resampling.BILINEAR))
    top, left = int(round((new_h - 224) / 2)), int(round((new_w - 224) / 2))
    want = resized[top : top + 224, left : left + 224]
    got = resize_to_training(data, 224, 224)
    assert got.shape == (224, 224, 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)


def test_spec_shapes_and_round_trip():
    raw = data_gen.get_profile("small").spec_for("raw", "imagenet")
    assert raw.image_shape == (224, 224, 3) and raw.raw_sample_bytes == 150_528
    assert fixed_size(raw) and not fixed_size(SMALL)
    with pytest.raises(VariableShapeError, match="differ in size.*RandomResizedCropFlip"):
        _ = SMALL.image_shape
    for spec in (raw, SMALL):
        assert spec_from_dict(spec.to_dict()) == spec
    assert SMALL.decoded_bytes == sum(
        3 * h * w for *_, h, w in (_draw_start(SMALL.seed, i) for i in range(SMALL.num_samples)))
    with pytest.raises(ValueError, match="raw PhotoSpec needs the height and width"):
        PhotoSpec(4, encoding="raw")
    with pytest.raises(ValueError, match="encoding must be one of"):
        PhotoSpec(4, encoding="png")
    with pytest.raises(ValueError, match="unknown PhotoSpec fields: \\['colour'\\]"):
        spec_from_dict({**SMALL.to_dict(), "colour": 1})


def test_profiles_define_the_family_without_touching_the_studies_sets(measured):
    mean = measured.sizes.mean()
    sizes = {}
    for name, profile in data_gen.PROFILES.items():
        jpeg, raw = profile.spec_for("jpeg", "imagenet"), profile.spec_for("raw", "imagenet")
        assert isinstance(jpeg, PhotoSpec) and jpeg.source == raw.source
        sizes[name] = jpeg.num_samples
        # The studies' sets are what they were.
        assert isinstance(profile.spec_for("jpeg"), data_gen.DatasetSpec)
        assert profile.family("synthetic") == profile.specs
    assert sizes["ci"] == 64
    assert 10_000 <= sizes["small"] <= 15_000
    assert 1.1e9 <= sizes["small"] * mean <= 1.6e9
    assert 8e9 <= sizes["medium"] * mean <= 12e9
    assert sizes["large"] * mean > 24 * 2**30  # larger than the 24 GiB machine's RAM
    with pytest.raises(KeyError, match="unknown dataset family 'coco'"):
        data_gen.get_profile("ci").family("coco")
    with pytest.raises(KeyError, match="no imagenet 'png' dataset"):
        data_gen.get_profile("ci").spec_for("png", "imagenet")
