"""The canonical dataset's specification and the named profiles."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ._fields import spec_from_fields
from .photo import PhotoSpec

ENCODINGS = ("raw", "png", "jpeg")


@dataclass(frozen=True)
class DatasetSpec:
    """Everything that determines the bytes of every sample."""

    num_samples: int
    height: int
    width: int
    channels: int = 3
    num_classes: int = 10
    encoding: str = "raw"
    jpeg_quality: int = 90
    seed: int = 0

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {self.channels}")
        for name in ("num_samples", "height", "width", "num_classes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in 1..100, got {self.jpeg_quality}")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)

    @property
    def raw_sample_bytes(self) -> int:
        return self.height * self.width * self.channels

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DatasetSpec:
        return spec_from_fields(cls, data)


# Dataset families a profile holds: the small synthetic sets the studies read, and the
# ImageNet-like set (``data_gen.photo``: JPEGs of many sizes, and their 224x224 raw copy).
FAMILIES = ("synthetic", "imagenet")


@dataclass(frozen=True)
class Profile:
    """A named set of datasets, one spec per encoding and family, sized for a purpose."""

    name: str
    specs: tuple[DatasetSpec, ...]
    description: str = ""
    imagenet: tuple[PhotoSpec, ...] = ()
    # The family the studies about an image training set run on (the others, e.g. the
    # targets set for tiny arrays, always read the synthetic sets).
    study_family: str = "synthetic"

    def __post_init__(self) -> None:
        if self.study_family not in FAMILIES:
            raise ValueError(f"profile {self.name!r}: study_family must be one of {FAMILIES}, "
                             f"got {self.study_family!r}")

    def family(self, name: str) -> tuple:
        """The specs of dataset family ``name`` (one of ``FAMILIES``)."""
        if name not in FAMILIES:
            raise KeyError(f"unknown dataset family {name!r}; known families: {list(FAMILIES)}")
        return self.specs if name == "synthetic" else self.imagenet

    def spec_for(self, encoding: str, family: str = "synthetic"):
        specs = self.family(family)
        for spec in specs:
            if spec.encoding == encoding:
                return spec
        raise KeyError(
            f"profile {self.name!r} has no {family} {encoding!r} dataset; it has "
            f"{[s.encoding for s in specs]}"
        )

    @property
    def raw_bytes(self) -> int:
        return sum(s.num_samples * s.raw_sample_bytes for s in self.specs)


TRAINING_SIZE = 224
IMAGENET_SEED = 4


def imagenet_like(num_samples: int) -> tuple[PhotoSpec, PhotoSpec]:
    """The ImageNet-like family of ``num_samples`` images: the JPEGs (about 110 KB each)
    and the same images pre-decoded at 224x224x3 (150 KB each)."""
    return (
        PhotoSpec(num_samples, encoding="jpeg", seed=IMAGENET_SEED),
        PhotoSpec(num_samples, encoding="raw", height=TRAINING_SIZE, width=TRAINING_SIZE,
                  seed=IMAGENET_SEED),
    )


# The ImageNet-like sets: ci 64 images; small 12k (about 1.3 GB of JPEG, 1.8 GB raw);
# medium 90k (about 10 GB of JPEG); large 250k (about 27 GB of JPEG, more than 24 GiB of RAM).
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "ci",
            (
                DatasetSpec(512, 32, 32, encoding="raw", seed=1),
                DatasetSpec(256, 32, 32, encoding="png", seed=2),
                DatasetSpec(256, 64, 64, encoding="jpeg", seed=3),
            ),
            "seconds to build every format; for tests and CI",
            imagenet_like(64),
        ),
        Profile(
            "small",
            (
                DatasetSpec(20_000, 64, 64, encoding="raw", seed=1),
                DatasetSpec(4_000, 64, 64, encoding="png", seed=2),
                DatasetSpec(4_000, 256, 256, encoding="jpeg", seed=3),
            ),
            "the default: 12k ImageNet-like JPEGs (1.3 GB) and their 224x224 raw copy for "
            "the training-set studies; 20k 64x64 raw (246 MB), PNG and 256x256 JPEG sets for "
            "the per-batch overhead studies",
            imagenet_like(12_000),
            study_family="imagenet",
        ),
        Profile(
            "medium",
            (
                DatasetSpec(200_000, 64, 64, encoding="raw", seed=1),
                DatasetSpec(20_000, 64, 64, encoding="png", seed=2),
                DatasetSpec(40_000, 256, 256, encoding="jpeg", seed=3),
            ),
            "a few GB: 200k 64x64 raw (2.5 GB) and 40k 256x256 JPEG",
            imagenet_like(90_000),
            study_family="imagenet",
        ),
        Profile(
            "large",
            (
                DatasetSpec(500_000, 128, 128, encoding="raw", seed=1),
                DatasetSpec(400_000, 256, 256, encoding="jpeg", seed=3),
            ),
            "opt-in, larger than a 24 GiB machine's RAM (25 GB raw)",
            imagenet_like(250_000),
            study_family="imagenet",
        ),
    )
}

DEFAULT_PROFILE = "small"


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown profile {name!r}; known profiles: {sorted(PROFILES)}") from None
