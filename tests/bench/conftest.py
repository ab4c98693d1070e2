"""Fixtures for the harness tests: a real ``ci`` dataset and one real study run, built once."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_support import TINY_LIMITS

from data_gen import PROFILES
from storebench.bench.envinfo import collect_env, write_env
from storebench.bench.limits import measure_limits
from storebench.bench.runner import run_cases
from storebench.formats import build_dataset
from storebench.studies.formats.grid import grid as formats_study


@pytest.fixture(scope="session")
def ci_data_dir(tmp_path_factory) -> Path:
    """The ``ci`` raw dataset as memmap (the format every other one is checked against)."""
    root = tmp_path_factory.mktemp("bench-data")
    build_dataset(PROFILES["ci"].spec_for("raw"), "memmap", root, workers=1)
    return root


@pytest.fixture(scope="session")
def formats_results(tmp_path_factory, ci_data_dir) -> Path:
    """A results directory from a real run of the ``formats`` study (2 repeats) plus its
    env.json with limits measured in the same run."""
    results = tmp_path_factory.mktemp("bench-results")
    cases = formats_study(profile="ci", data_dir=ci_data_dir, repeats=2)
    run_cases(cases, results / "formats.csv", profile="ci", progress=False, timeout_s=120)
    limits = measure_limits(ci_data_dir, sizes=TINY_LIMITS)
    write_env(results / "env.json", collect_env(ci_data_dir, profile="ci", limits=limits))
    return results
