"""Peer libraries' own loader pipelines (peers environment): see ``loaders.paths``.

One module per peer; each imports its library only inside its functions. The helpers here
are what several of them share.
"""

from __future__ import annotations

import io

import numpy as np

from ...formats.base import has_encoding_magic


def decode_image(data, decode: str | None, channels: int) -> np.ndarray | bytes:
    """One stored image decoded as ``decode`` says (``simplejpeg``, ``pil``, ``auto``; None:
    the stored bytes), as (H, W, C) uint8."""
    if decode is None:
        return bytes(data)
    if decode == "simplejpeg" or (decode == "auto" and has_encoding_magic("jpeg", data)):
        import simplejpeg

        image = simplejpeg.decode_jpeg(data, colorspace="GRAY" if channels == 1 else "RGB")
        return image.reshape(*image.shape[:2], -1)
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        mode = "L" if channels == 1 else "RGB"
        image = np.asarray(img if img.mode == mode else img.convert(mode))
    return image.reshape(*image.shape[:2], -1)
