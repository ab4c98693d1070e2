"""The remote study's epoch case against a real S3 server: each rank stops on its steady
window, and its rows keep start-up apart from the rate."""

from __future__ import annotations

import pytest

from storebench.bench.case import CASE_REPEAT, Case, Trial
from storebench.bench.worker import _check_metrics
from storebench.studies.remote.cases import REMOTE_ROOT_ENV, remote_epoch_case

BATCH = 8  # the ci JPEG set's 256 samples: 32 batches, 16 a rank at 2 ranks


def epoch_case(path, *, ranks: int, steady_batches: int) -> Case:
    return Case(study="remote", function="storebench.studies.remote.cases:remote_epoch_case",
                dataset=str(path), format="tfrecord", loader="lazy", prefetcher="thread",
                workers=2, batch_size=BATCH, access="shuffle", steady_batches=steady_batches,
                steady_seconds=0.0,
                params={"source": "s3", "rtt_ms": 0, "ranks": ranks, "concurrency": 16})


@pytest.fixture
def remote_env(uploaded, s3, monkeypatch):
    path, url = uploaded("tfrecord", "jpeg")
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(REMOTE_ROOT_ENV, url.rsplit("/", 1)[0])
    return path


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks", [1, 2])
def test_each_rank_stops_once_its_steady_window_holds_the_minimum(remote_env, ranks):
    case = epoch_case(remote_env, ranks=ranks, steady_batches=3)
    metrics = remote_epoch_case(case, Trial(case, 0))
    _check_metrics(case, metrics, {})  # names and units the worker accepts
    read_ahead = int(metrics["read_ahead_batches"][0])
    assert read_ahead == 4  # two batches per prefetch thread
    # Each rank stopped at the batch that filled its window (the read-ahead, the batch that
    # opens the window, then 3): fewer than its share, the checks passed.
    assert metrics["samples"][0] == ranks * (read_ahead + 1 + 3) * BATCH < 256
    assert metrics["steady_batches"] == (3, "count")
    assert metrics["samples_per_s"][0] > 0 and metrics["steady_seconds"][0] > 0
    assert metrics["time_to_first_batch_s"][0] > metrics["open_seconds"][0] > 0
    assert metrics["requests"][0] > 0


@pytest.mark.timeout(240)
def test_an_epoch_its_window_never_fills_reads_the_whole_set_and_the_warm_up_its_batches(
        remote_env):
    case = epoch_case(remote_env, ranks=1, steady_batches=1000)
    metrics = remote_epoch_case(case, Trial(case, 0))
    assert metrics["samples"] == (256, "count")  # covered the set, checked
    assert metrics["steady_batches"][0] == 256 // BATCH - 4 - 1
    warm = remote_epoch_case(case, Trial(case, CASE_REPEAT))
    assert warm["samples"] == (2 * BATCH, "count")  # WARMUP_BATCHES, no window stop
