"""The canonical synthetic image dataset: a spec, named profiles and a deterministic generator."""

from ._fields import VariableShapeError
from .generate import SHAPE_KINDS, encode, generate, render, sample
from .photo import PhotoSpec
from .spec import (
    DEFAULT_PROFILE,
    ENCODINGS,
    FAMILIES,
    PROFILES,
    DatasetSpec,
    Profile,
    get_profile,
    imagenet_like,
)

__all__ = [
    "DEFAULT_PROFILE",
    "ENCODINGS",
    "FAMILIES",
    "PROFILES",
    "SHAPE_KINDS",
    "DatasetSpec",
    "PhotoSpec",
    "Profile",
    "VariableShapeError",
    "encode",
    "generate",
    "get_profile",
    "imagenet_like",
    "render",
    "sample",
]
