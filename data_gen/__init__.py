"""The canonical synthetic image dataset: a spec, named profiles and a deterministic generator."""

from .generate import SHAPE_KINDS, encode, generate, render, sample
from .spec import DEFAULT_PROFILE, ENCODINGS, PROFILES, DatasetSpec, Profile, get_profile

__all__ = [
    "DEFAULT_PROFILE",
    "ENCODINGS",
    "PROFILES",
    "SHAPE_KINDS",
    "DatasetSpec",
    "Profile",
    "encode",
    "generate",
    "get_profile",
    "render",
    "sample",
]
