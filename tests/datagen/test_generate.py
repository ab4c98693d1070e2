"""The canonical dataset is a pure function of (spec, index)."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import data_gen
from data_gen import DatasetSpec

RAW = DatasetSpec(64, 32, 32, encoding="raw", seed=11)
PNG = DatasetSpec(24, 32, 32, encoding="png", seed=12)
JPEG = DatasetSpec(24, 48, 48, encoding="jpeg", jpeg_quality=85, seed=13)


def as_bytes(image) -> bytes:
    return image if isinstance(image, bytes) else image.tobytes()


@pytest.mark.parametrize("spec", [RAW, PNG, JPEG], ids=["raw", "png", "jpeg"])
def test_order_and_process_count_do_not_change_bytes(spec):
    forward = [data_gen.sample(spec, i) for i in range(spec.num_samples)]
    backward = [data_gen.sample(spec, i) for i in reversed(range(spec.num_samples))][::-1]
    parallel = list(data_gen.generate(spec, workers=2, chunk_size=5))
    serial = list(data_gen.generate(spec, workers=1))
    for got in (backward, parallel, serial):
        assert [as_bytes(im) for im, _ in got] == [as_bytes(im) for im, _ in forward]
        assert [label for _, label in got] == [label for _, label in forward]


def test_same_bytes_in_a_fresh_interpreter():
    code = (
        "import hashlib, data_gen;"
        "spec = data_gen.DatasetSpec(16, 32, 32, encoding='jpeg', seed=5);"
        "h = hashlib.sha256();"
        "[h.update(data_gen.sample(spec, i)[0]) for i in range(16)]; print(h.hexdigest())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import hashlib

    spec = DatasetSpec(16, 32, 32, encoding="jpeg", seed=5)
    h = hashlib.sha256()
    for i in range(16):
        h.update(data_gen.sample(spec, i)[0])
    assert out.stdout.strip() == h.hexdigest()


def test_types_shapes_and_decodability():
    image, label = data_gen.sample(RAW, 3)
    assert image.dtype == np.uint8 and image.shape == (32, 32, 3)
    assert isinstance(label, int) and 0 <= label < RAW.num_classes
    png, png_label = data_gen.sample(PNG, 3)
    assert png.startswith(b"\x89PNG")
    pixels, render_label = data_gen.render(PNG, 3)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), pixels)
    assert png_label == render_label
    jpeg, _ = data_gen.sample(JPEG, 3)
    assert jpeg[:2] == b"\xff\xd8"
    decoded = np.asarray(Image.open(io.BytesIO(jpeg)), dtype=np.int16)
    assert (
        np.abs(decoded - data_gen.render(JPEG, 3)[0]).mean() < 12
    )  # lossy (noise, 4:2:0 chroma), but close; another image is ~50 off


def test_seed_changes_the_data_and_images_are_not_noise():
    a, _ = data_gen.sample(RAW, 0)
    b, _ = data_gen.sample(DatasetSpec(64, 32, 32, seed=12), 0)
    assert not np.array_equal(a, b)
    # Smooth gradients and flat shapes: neighbouring pixels are close, unlike uniform noise.
    step = np.abs(np.diff(a.astype(np.int16), axis=1)).mean()
    assert step < 20
    # PNG of such images compresses well below the raw size; noise would not.
    big = DatasetSpec(8, 64, 64, encoding="png")
    assert np.mean([len(data_gen.sample(big, i)[0]) for i in range(8)]) < 0.7 * 64 * 64 * 3


def test_labels_cover_the_classes_and_depend_on_class_conditional_content():
    spec = DatasetSpec(400, 32, 32, num_classes=4, seed=3)
    samples = [data_gen.render(spec, i) for i in range(spec.num_samples)]
    labels = np.array([label for _, label in samples])
    assert set(labels) == {0, 1, 2, 3}
    # A nearest-class-mean classifier on the mean colour beats chance clearly.
    features = np.array([img.reshape(-1, 3).mean(0) for img, _ in samples])
    train, test = slice(0, 300), slice(300, 400)
    means = np.stack([features[train][labels[train] == c].mean(0) for c in range(4)])
    predicted = np.argmin(((features[test][:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (predicted == labels[test]).mean() > 0.4


def test_bad_specs_and_indices_are_refused():
    with pytest.raises(ValueError, match="encoding must be one of"):
        DatasetSpec(4, 8, 8, encoding="webp")
    with pytest.raises(ValueError, match="num_samples must be positive"):
        DatasetSpec(0, 8, 8)
    with pytest.raises(ValueError, match="jpeg_quality"):
        DatasetSpec(4, 8, 8, encoding="jpeg", jpeg_quality=0)
    with pytest.raises(IndexError, match="out of range"):
        data_gen.sample(RAW, RAW.num_samples)
    with pytest.raises(KeyError, match="unknown profile 'huge'; known profiles"):
        data_gen.get_profile("huge")
    with pytest.raises(ValueError, match="unknown DatasetSpec fields"):
        DatasetSpec.from_dict({**RAW.to_dict(), "colour": 1})


def test_profiles_are_sized_as_documented():
    ci, small = data_gen.PROFILES["ci"], data_gen.PROFILES["small"]
    assert {s.encoding for s in ci.specs} == {"raw", "png", "jpeg"}
    assert small.spec_for("raw").num_samples == 20_000 and small.spec_for("raw").height == 64
    assert small.spec_for("jpeg").height == 256
    assert data_gen.PROFILES["large"].raw_bytes > 24 * 2**30  # larger than this machine's RAM
    assert data_gen.DEFAULT_PROFILE == "small"


def test_a_script_without_main_guard_fails_fast_with_the_fix(tmp_path):
    """Spawned generator workers re-run the main script; without the guard they cannot
    start. The build must end promptly with the fix in the message, not respawn forever."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "build_unguarded.py"
    out = tmp_path / "out"
    script.write_text(textwrap.dedent(f"""
        from data_gen import DatasetSpec
        from storebench.formats import build_dataset
        build_dataset(DatasetSpec(300, 16, 16, encoding="png"), "lmdb", {str(out)!r},
                      workers=2)
        print("built")
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode != 0 and "built" not in done.stdout
    assert "WorkersFailedToStartError" in done.stderr
    assert f"re-runs your main module {script}" in done.stderr
    assert 'if __name__ == "__main__":` guard' in done.stderr
    assert list(out.iterdir()) == []  # the partial build was removed
