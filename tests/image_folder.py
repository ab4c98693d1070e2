"""A user's image folder, made for the tests: JPEG and PNG files of varied sizes and modes
(RGB, greyscale, CMYK JPEG, palette and RGBA PNG) in class folders whose names hold spaces
and non-ASCII characters, plus files an import must ignore."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

CLASS_NAMES = ("chat noir éè", "golden retriever", "日本 犬")
# (PIL mode, format, suffix): cycled over each class's images.
KINDS = (
    ("RGB", "JPEG", ".jpg"),
    ("L", "JPEG", ".JPG"),
    ("CMYK", "JPEG", ".jpeg"),
    ("P", "PNG", ".png"),
    ("RGBA", "PNG", ".png"),
    ("RGB", "PNG", ".PNG"),
    ("L", "PNG", ".png"),
)


def image_bytes(rng: np.random.Generator, mode: str, fmt: str, size: tuple[int, int]) -> bytes:
    height, width = size
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 // max(width - 1, 1), yy * 255 // max(height - 1, 1),
                     np.full_like(xx, int(rng.integers(256)))], axis=-1)
    pixels = np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    image = image.convert(mode) if mode != "P" else image.quantize(colors=32)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def make_image_folder(root: Path, *, per_class: int = 10, seed: int = 0) -> list[Path]:
    """Write the folder under ``root``; return the image files in import order (classes
    sorted by name, files sorted by relative path)."""
    rng = np.random.default_rng(seed)
    written = []
    for c, name in enumerate(CLASS_NAMES):
        folder = root / name
        (folder / "nested dir").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            mode, fmt, suffix = KINDS[(i + c) % len(KINDS)]
            size = (int(rng.integers(24, 97)), int(rng.integers(24, 97)))
            sub = folder / "nested dir" if i % 4 == 3 else folder
            path = sub / f"img {i:02d} ü{suffix}"
            path.write_bytes(image_bytes(rng, mode, fmt, size))
            written.append(path)
        (folder / "notes.txt").write_text("not an image")
        (folder / ".hidden.jpg").write_bytes(b"ignored: hidden")
    (root / ".cache").mkdir(exist_ok=True)
    order = {name: c for c, name in enumerate(CLASS_NAMES)}
    return sorted(written, key=lambda p: (order[p.relative_to(root).parts[0]],
                                          str(p.relative_to(root))))
