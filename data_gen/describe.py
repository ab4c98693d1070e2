"""What an ImageNet-like set looks like, measured: quantiles of width, height and bytes.

``describe(spec, samples)`` generates the first ``samples`` images of ``spec`` (its JPEG set)
and measures them; ``quantile_table`` renders that as the Markdown table that
``docs/imagenet-like.md`` holds between ``TABLE_BEGIN`` and ``TABLE_END`` (a test checks that
the page matches; ``python -m storebench describe-set --write docs/imagenet-like.md``
rewrites it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .photo import PhotoSpec, photo_sample

QUANTILES = (5, 25, 50, 75, 95)
DESCRIBE_SAMPLES = 300
TABLE_BEGIN = "<!-- describe-set: begin -->"
TABLE_END = "<!-- describe-set: end -->"


@dataclass(frozen=True)
class SetDescription:
    """Per-image measurements of the first ``len(widths)`` images of a JPEG set."""

    widths: np.ndarray
    heights: np.ndarray
    sizes: np.ndarray  # encoded bytes
    greyscale: np.ndarray  # bool: stored with one channel

    @property
    def shorter(self) -> np.ndarray:
        return np.minimum(self.widths, self.heights)

    @property
    def bytes_per_pixel(self) -> np.ndarray:
        return self.sizes / (self.widths * self.heights)

    def quantiles(self, values: np.ndarray) -> np.ndarray:
        return np.percentile(values, QUANTILES)


def describe(spec: PhotoSpec, samples: int = DESCRIBE_SAMPLES) -> SetDescription:
    """Measure images 0 .. ``samples - 1`` of ``spec``'s JPEG set."""
    import simplejpeg

    source = spec.source
    count = min(samples, source.num_samples)
    rows = []
    for i in range(count):
        data, _ = photo_sample(source, i)
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        rows.append((width, height, len(data), colorspace == "Gray"))
    widths, heights, sizes, grey = (np.array(col) for col in zip(*rows, strict=True))
    return SetDescription(widths, heights, sizes, grey.astype(bool))


def quantile_table(description: SetDescription) -> str:
    """The Markdown table of ``description``'s quantiles and means."""
    d = description
    head = "| | " + " | ".join(f"p{q}" for q in QUANTILES) + " | mean |"
    lines = [head, "|---" * (len(QUANTILES) + 2) + "|"]
    for name, values, fmt in (
        ("width (px)", d.widths, "{:.0f}"),
        ("height (px)", d.heights, "{:.0f}"),
        ("shorter side (px)", d.shorter, "{:.0f}"),
        ("encoded size (KB)", d.sizes / 1000, "{:.1f}"),
        ("bytes per pixel", d.bytes_per_pixel, "{:.2f}"),
    ):
        cells = [fmt.format(v) for v in d.quantiles(values)] + [fmt.format(values.mean())]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"{len(d.widths)} images; {int(d.greyscale.sum())} greyscale "
                 f"({100 * d.greyscale.mean():.1f}%).")
    return "\n".join(lines)


def replace_table(page: str, table: str) -> str:
    """``page`` with the text between ``TABLE_BEGIN`` and ``TABLE_END`` replaced by
    ``table``."""
    if TABLE_BEGIN not in page or TABLE_END not in page:
        raise ValueError(f"the page has no {TABLE_BEGIN} ... {TABLE_END} markers")
    head, rest = page.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    return f"{head}{TABLE_BEGIN}\n{table}\n{TABLE_END}{tail}"
