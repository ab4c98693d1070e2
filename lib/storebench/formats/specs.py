"""What a built dataset holds: a synthetic ``data_gen.DatasetSpec``, or an ``ImportedSpec``
for a user's own images (``storebench.importer``).

Readers, writers and loaders ask a spec the same questions of both: ``num_samples``,
``encoding``, ``channels``, ``num_classes``, ``image_shape`` and ``raw_sample_bytes``. An
imported set of encoded images of mixed sizes has no single shape: ``fixed_size`` is False
there and ``image_shape`` raises ``VariableShapeError`` saying how to get one (decode with a
resize transform, or import with ``--resize``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from data_gen import DatasetSpec, VariableShapeError
from data_gen.photo import PHOTO_KIND, PhotoSpec
from data_gen.spec import spec_from_fields

# "mixed": a folder of JPEG and PNG files, each kept in its own encoding.
IMPORTED_ENCODINGS = ("raw", "jpeg", "png", "mixed")
IMPORTED_KIND = "imported"


@dataclass(frozen=True)
class ImportedSpec:
    """A dataset imported from image files: its samples are the source files' bytes (or,
    for ``encoding="raw"``, their pixels resized to ``height`` x ``width``), in the order of
    the source listing.

    ``height``/``width`` are set when every image has that size (always for raw); else 0.
    Decoded images are RGB (``channels=3``) whatever the files' modes (greyscale, CMYK,
    palette), as ImageFolder pipelines convert them; ``decoded_bytes`` is the sum of their
    decoded sizes (what the formats study compares stored bytes with). ``source_digest`` is
    the SHA-256 over the source files' checksums, so a re-import of changed files is a
    different spec.
    """

    num_samples: int
    encoding: str
    class_names: tuple[str, ...]
    source: str
    source_digest: str
    stored_bytes: int
    height: int = 0
    width: int = 0
    decoded_bytes: int = 0
    channels: int = 3
    resize_filter: str = ""
    kind: str = IMPORTED_KIND

    def __post_init__(self) -> None:
        object.__setattr__(self, "class_names", tuple(self.class_names))
        if self.kind != IMPORTED_KIND:
            raise ValueError(f"kind must be {IMPORTED_KIND!r}, got {self.kind!r}")
        if self.encoding not in IMPORTED_ENCODINGS:
            raise ValueError(
                f"encoding must be one of {IMPORTED_ENCODINGS}, got {self.encoding!r}"
            )
        if self.num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {self.num_samples}")
        if not self.class_names:
            raise ValueError("an imported dataset needs at least one class")
        if self.channels != 3:
            raise ValueError(f"imported images decode to RGB (3 channels), got {self.channels}")
        if (self.height > 0) != (self.width > 0) or self.height < 0 or self.width < 0:
            raise ValueError(f"height and width must both be set or both 0, got "
                             f"{self.height}x{self.width}")
        if self.encoding == "raw" and not self.fixed_size:
            raise ValueError("raw imported samples need a fixed height x width (the resize)")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def fixed_size(self) -> bool:
        return self.height > 0

    @property
    def image_shape(self) -> tuple[int, int, int]:
        if not self.fixed_size:
            raise VariableShapeError(
                f"the images imported from {self.source} differ in size, so there is no one "
                "image shape: decode them with a resize transform "
                "(storebench.loaders.Resize), or import with --resize HxW for raw arrays"
            )
        return (self.height, self.width, self.channels)

    @property
    def raw_sample_bytes(self) -> int:
        h, w, c = self.image_shape
        return h * w * c

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["class_names"] = list(self.class_names)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ImportedSpec:
        return spec_from_fields(cls, data)


Spec = DatasetSpec | ImportedSpec | PhotoSpec


def spec_from_dict(data: dict) -> Spec:
    """The spec a manifest records: imported ones say ``kind: imported``."""
    if not isinstance(data, dict):
        raise TypeError(f"a spec is a JSON object, got {type(data).__name__}")
    if data.get("kind") == IMPORTED_KIND:
        return ImportedSpec.from_dict(data)
    if data.get("kind") == PHOTO_KIND:
        return PhotoSpec.from_dict(data)
    return DatasetSpec.from_dict(data)


def is_imported(spec: Spec) -> bool:
    return isinstance(spec, ImportedSpec)


def fixed_size(spec: Spec) -> bool:
    """Whether every image of ``spec`` has ``spec.image_shape``."""
    return getattr(spec, "fixed_size", True)  # a DatasetSpec's images are all one size


def stored_image_shape(spec: Spec, image) -> tuple[int, int, int]:
    """The (H, W, C) one stored sample decodes to: the spec's shape when fixed, else read
    from the PNG/JPEG header (no pixel is decoded)."""
    if fixed_size(spec):
        return spec.image_shape
    import io

    from PIL import Image

    with Image.open(io.BytesIO(bytes(image))) as img:
        width, height = img.size
    return (height, width, spec.channels)
