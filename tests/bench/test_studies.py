"""The study registry: every study lays out valid, uniquely named cases over built data,
and a loader case runs for real in a worker."""

from __future__ import annotations

import pytest

from storebench.bench.cache import resident_fraction
from storebench.bench.runner import run_case
from storebench.bench.studies import STUDIES, get_study


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_every_study_lays_out_unique_cases_over_the_built_data(name, ci_data_dir):
    cases = STUDIES[name](profile="ci", data_dir=ci_data_dir, repeats=2)
    assert cases, name
    ids = [case.case_id for case in cases]
    assert len(ids) == len(set(ids))
    for case in cases:
        assert case.study == name
        assert case.dataset.startswith(str(ci_data_dir))
        if case.cache:
            assert case.cache_files and all(f.startswith(case.dataset) for f in case.cache_files)
        assert case.repeats in (1, 2)


def test_unknown_study_and_missing_data(tmp_path):
    with pytest.raises(KeyError, match="known studies: \\['formats'"):
        get_study("nope")
    with pytest.raises(FileNotFoundError, match="no datasets of profile 'ci'"):
        STUDIES["formats"](profile="ci", data_dir=tmp_path)


@pytest.mark.timeout(120)
def test_a_preloaded_cold_epoch_runs_in_a_worker(ci_data_dir):
    case = next(c for c in STUDIES["lazy_vs_preloaded"](profile="ci", data_dir=ci_data_dir,
                                                         repeats=1)
                if c.loader == "preloaded" and c.cache == "cold")
    outcome = run_case(case, timeout_s=110)
    assert outcome.status == "ok", outcome.error
    metrics = {r["metric"]: r for r in outcome.records}
    assert metrics["samples"]["value"] == 512
    assert metrics["samples"]["resident_fraction"] < 0.05
    assert metrics["preload_seconds"]["value"] > 0
    assert metrics["time_to_first_batch_s"]["value"] >= metrics["preload_seconds"]["value"]
    # The preload read the whole dataset: it is resident now.
    assert resident_fraction(case.cache_files) > 0.95
