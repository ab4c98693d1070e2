"""Session fixtures: the ``ci`` profile built once in every format."""

from __future__ import annotations

from pathlib import Path

import pytest

import data_gen
from storebench.formats import FORMATS, build_dataset


@pytest.fixture(scope="session")
def ci_profile() -> data_gen.Profile:
    return data_gen.PROFILES["ci"]


@pytest.fixture(scope="session")
def ci_data_root(tmp_path_factory, ci_profile) -> Path:
    """Every format x encoding of the ci profile, built once for the whole session."""
    root = tmp_path_factory.mktemp("ci-data")
    for spec in ci_profile.specs:
        for name, module in FORMATS.items():
            if spec.encoding in module.ENCODINGS:
                build_dataset(spec, name, root, workers=1)
    return root


@pytest.fixture(scope="session")
def ci_dataset(ci_data_root):
    """Path of one built ci dataset: ``ci_dataset("hdf5", "jpeg")``."""

    def path(format_name: str, encoding: str) -> Path:
        return ci_data_root / f"{format_name}-{encoding}"

    return path
