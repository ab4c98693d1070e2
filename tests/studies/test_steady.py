"""Start-up apart from steady state in the loader cases (``studies.steady``,
``shared_cases.run_loader`` / ``loader_epoch_case``): which batches the steady window
counts, workers kept across a case's epochs, every sample once per epoch, a fresh loader
(and fresh workers) per repeat."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import pytest

from data_gen import PROFILES
from storebench.bench.case import Case, Trial
from storebench.formats import build_dataset, open_dataset
from storebench.loaders import LazyDataset
from storebench.studies.steady import SteadyMinimum, SteadyWindow, persists_workers

START_METHODS = ["fork", "spawn", "forkserver"]
LOG = "STOREBENCH_STEADY_PROBE_LOG"
SLOW_FIRST_S = 0.5
FUNCTION = "storebench.studies.shared_cases:loader_epoch_case"


class ProbeDataset(LazyDataset):
    """Logs, for each batch it reads, the batch's first index, the reading process and when
    the read ended (``perf_counter``, one clock for every process here) to the file named
    by ``$STOREBENCH_STEADY_PROBE_LOG``; the epoch's first batch (first index == the
    sampler's first) is slow, so other workers read ahead meanwhile."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Read here, in the process that makes the dataset, and carried to workers with it:
        # a forkserver started by an earlier test holds that test's environment, not ours.
        self.probe_log = os.environ[LOG]
        self.slow_first = int(os.environ.get("STOREBENCH_STEADY_SLOW", "-1"))

    def get_batch(self, indices, *, out=None):
        if int(indices[0]) == self.slow_first:
            time.sleep(SLOW_FIRST_S)
        batch = super().get_batch(indices, out=out)
        with open(self.probe_log, "a") as log:
            log.write(f"{int(indices[0])} {os.getpid()} {time.perf_counter()!r}\n")
        return batch


def probe_log(path: Path) -> list[tuple[int, int, float]]:
    return [(int(a), int(b), float(c))
            for a, b, c in (line.split() for line in path.read_text().splitlines())]


@pytest.fixture(scope="module")
def memmap_set(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("steady-data")
    build_dataset(PROFILES["ci"].spec_for("raw"), "memmap", root, workers=1)
    return root / "memmap-raw"


@pytest.fixture
def probe(monkeypatch, tmp_path) -> Path:
    import storebench.loaders

    log = tmp_path / "probe.log"
    log.touch()
    monkeypatch.setenv(LOG, str(log))
    monkeypatch.setattr(storebench.loaders, "LazyDataset", ProbeDataset)
    return log


def loader_case(dataset: Path, prefetcher: str, *, workers: int | None = 2, steady: int = 3,
                **fields) -> Case:
    return Case(study="s", function=FUNCTION, format="memmap", encoding="raw",
                dataset=str(dataset), loader="lazy", prefetcher=prefetcher, workers=workers,
                batch_size=32, access="shuffle", repeats=1, steady_batches=steady, **fields)


def run_case(case: Case):
    """``run_loader`` as ``loader_epoch_case`` runs it, returning the run itself."""
    from storebench.studies.shared_cases import (
        check_run,
        make_dataset,
        make_sampler,
        open_batches,
        release,
        steady_minimum,
    )
    from storebench.studies.shared_cases import run_loader as run

    trial = Trial(case, 0)
    reader = open_dataset(case.dataset, verify=False)
    dataset = make_dataset(case, reader)
    sampler = make_sampler(case, reader)
    loader, close = open_batches(case, dataset, sampler)
    try:
        result = run(case, loader, sampler, started=time.perf_counter(),
                     num_samples=len(reader), max_batches=None,
                     minimum=steady_minimum(case, trial))
        check_run(case, result, len(reader), None)
        return result, len(reader), sampler
    finally:
        release(reader, dataset=dataset, close=close)


def test_the_window_counts_the_batches_after_the_read_ahead_over_their_hand_out_times():
    window = SteadyWindow(skip=3)
    for k in range(10):  # batch k: k + 1 samples, 10 bytes each, handed out at k seconds
        window.add(k + 1, 10 * (k + 1), float(k))
    assert (window.batches, window.samples, window.nbytes) == (6, sum(range(5, 11)), 450)
    assert window.seconds == 6.0 and window.rate() == sum(range(5, 11)) / 6.0
    assert window.met(SteadyMinimum(6, 6.0)) and not window.met(SteadyMinimum(7, 0.0))
    assert not window.met(SteadyMinimum(6, 6.5))
    # A path that starts afresh: skip its read-ahead again; the gap is not counted.
    window.restart()
    for k in range(5):
        window.add(1, 1, 100.0 + k)
    assert window.batches == 7 and window.seconds == 7.0


def test_a_window_with_nothing_read_ahead_opens_at_the_first_batch():
    window = SteadyWindow(skip=0)
    assert not window.met(SteadyMinimum(0, 0.0))  # at least one batch, whatever the minimum
    window.add(4, 4, 1.0)
    window.add(4, 4, 3.0)
    assert (window.batches, window.samples, window.seconds) == (1, 4, 2.0)


def test_a_steady_minimum_is_checked():
    with pytest.raises(ValueError, match="batches >= 0 and seconds >= 0"):
        SteadyMinimum(1, -1.0)
    with pytest.raises(ValueError, match="steady_batches must be positive"):
        Case(study="s", function=FUNCTION, steady_batches=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("prefetcher", ["thread", "process"])
def test_the_steady_window_excludes_every_batch_read_before_the_first_hand_out(
        memmap_set, probe, monkeypatch, prefetcher):
    """The epoch's first batch is slow, so the other worker reads ahead while the consumer
    waits: every batch read before the first was handed out is one the window skips."""
    case = loader_case(memmap_set, prefetcher, steady=4)
    reader = open_dataset(case.dataset, verify=False)
    from storebench.studies.shared_cases import make_sampler

    monkeypatch.setenv("STOREBENCH_STEADY_SLOW", str(make_sampler(case, reader).indices()[0]))
    reader.close()
    run, _, _ = run_case(case)
    first = run.epochs[0]
    log = probe_log(probe)
    order = [int(i[0]) for i in first.seen]
    read_early = [order.index(index) for index, _, at in log[:len(order)]
                  if at < first.first_batch_at]
    assert read_early, "nothing was read ahead: the test proves nothing"
    assert max(read_early) < run.read_ahead == 4
    assert run.window.batches >= 4 and run.window.batches == (
        sum(epoch.batches for epoch in run.epochs) - run.read_ahead - 1)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", START_METHODS)
def test_process_workers_start_once_per_case_and_every_epoch_delivers_each_sample_once(
        memmap_set, probe, start_method):
    """Enough steady batches for three epochs of the ci set: one pool serves them all (two
    worker pids in the log), each whole epoch holds every sample once, in a fresh order."""
    num_samples = 512  # the ci raw set
    per_epoch = num_samples // 32
    case = loader_case(memmap_set, "process", steady=2 * per_epoch,
                       params={"start_method": start_method})
    run, n, _ = run_case(case)
    assert n == num_samples and len(run.epochs) >= 3 and run.persistent
    pids = {pid for _, pid, _ in probe_log(probe)}
    assert len(pids) == 2 and os.getpid() not in pids
    orders = []
    for epoch in run.epochs:
        if not epoch.stopped:
            assert np.array_equal(np.sort(epoch.indices()), np.arange(n))
            orders.append(epoch.indices())
    assert len(orders) >= 2 and not np.array_equal(orders[0], orders[1])


@pytest.mark.timeout(180)
def test_torch_workers_persist_across_the_epochs_of_a_case_and_stop_with_it(memmap_set,
                                                                           probe):
    pytest.importorskip("torch")
    import psutil

    case = loader_case(memmap_set, "torch", steady=40)
    run, n, _ = run_case(case)
    assert len(run.epochs) >= 3 and run.persistent and run.read_ahead == 4
    pids = {pid for _, pid, _ in probe_log(probe)}
    assert len(pids) == 2
    alive = [p for p in pids if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


@pytest.mark.timeout(120)
def test_a_path_that_restarts_per_epoch_skips_its_read_ahead_each_epoch(memmap_set):
    case = loader_case(memmap_set, "locked_list_baseline", workers=None, steady=20)
    run, _, _ = run_case(case)
    assert not run.persistent and len(run.epochs) >= 2
    counted = sum(max(0, epoch.batches - run.read_ahead - 1) for epoch in run.epochs)
    assert run.window.batches == counted
    assert not persists_workers("none", 0) and persists_workers("torch", 2)
    assert not persists_workers("torch", 0) and persists_workers("tf_data", None)


@pytest.mark.timeout(120)
def test_a_cold_lazy_read_stops_with_its_first_epoch(memmap_set):
    from storebench.studies.shared_cases import dataset_files

    case = loader_case(memmap_set, "thread", steady=1000, cache="cold",
                       cache_files=dataset_files(memmap_set))
    run, n, _ = run_case(case)
    assert len(run.epochs) == 1 and run.epochs[0].samples == n
    assert 0 < run.window.batches < 1000


@pytest.mark.timeout(180)
def test_each_repeat_starts_a_fresh_pool_and_reports_start_up_and_steady_state_apart(
        memmap_set, probe):
    from storebench.studies.shared_cases import loader_epoch_case

    case = loader_case(memmap_set, "process", steady=20)
    pids = []
    for repeat in (0, 1):
        before = len(probe_log(probe))
        metrics = loader_epoch_case(case, Trial(case, repeat))
        pids.append({pid for _, pid, _ in probe_log(probe)[before:]})
        assert metrics["steady_batches"] == (20, "count")
        assert metrics["read_ahead_batches"] == (4, "count")
        assert metrics["persistent_workers"] == (1.0, "count")
        assert metrics["steady_epochs"][0] >= 2  # 16 batches an epoch: it ran on
        assert metrics["samples"][0] >= (4 + 1 + 20) * 32
        assert metrics["steady_seconds"][0] > 0
        assert metrics["time_to_first_batch_s"][0] > 0
    assert len(pids[0]) == len(pids[1]) == 2 and not pids[0] & pids[1]


def test_the_warm_up_reads_its_few_batches_in_one_epoch(memmap_set, probe):
    from storebench.bench.case import WARMUP_BATCHES
    from storebench.bench.schema import CASE_REPEAT
    from storebench.studies.shared_cases import loader_epoch_case

    case = loader_case(memmap_set, "thread", steady=100)
    metrics = loader_epoch_case(case, Trial(case, CASE_REPEAT))
    assert metrics == {"samples": (WARMUP_BATCHES * 32, "count")}
    assert len(probe_log(probe)) == WARMUP_BATCHES


def test_the_plan_sizes_the_steady_window_small_for_ci():
    from storebench.bench.plan import STEADY_BATCHES, STEADY_SECONDS, plan_for
    from storebench.studies.grid import epoch_fields, steady_fields

    assert steady_fields("small") == {"steady_batches": STEADY_BATCHES,
                                      "steady_seconds": STEADY_SECONDS}
    assert (STEADY_BATCHES, STEADY_SECONDS) == (20, 1.0)
    ci = plan_for("ci")
    assert ci.steady_seconds == 0.0 and ci.steady_batches < STEADY_BATCHES
    assert epoch_fields("ci")["steady_batches"] == ci.steady_batches


@pytest.mark.timeout(300)
def test_tf_data_runs_on_across_epochs_of_its_repeated_pipeline(tmp_path):
    """tf.data's pipeline is repeated, not made again per epoch: its epochs are stretches of
    the set's sample count, each whole (batches never straddle two)."""
    pytest.importorskip("tensorflow")
    build_dataset(PROFILES["ci"].spec_for("jpeg"), "tfrecord", tmp_path, workers=1)
    path = tmp_path / "tfrecord-jpeg"
    n = len(open_dataset(path, verify=False))
    per_epoch = -(-n // 32)
    case = Case(study="s", function=FUNCTION, format="tfrecord", encoding="jpeg",
                dataset=str(path), loader="lazy", prefetcher="tf_data", batch_size=32,
                access="shuffle", repeats=1, steady_batches=2 * per_epoch,
                params={"decode": "tf", "shuffle_buffer": 64})
    run, _, _ = run_case(case)
    assert run.persistent and run.read_ahead == 2 + 2 * len(os.sched_getaffinity(0))
    assert len(run.epochs) >= 3
    assert [epoch.samples for epoch in run.epochs if not epoch.stopped] == [n] * sum(
        not epoch.stopped for epoch in run.epochs)
    # A buffer larger than the set holds the set: its read-ahead is the set's batches.
    larger = dataclasses.replace(case, params={"decode": "tf", "shuffle_buffer": 4096},
                                 steady_batches=1)
    assert run_case(larger)[0].read_ahead == per_epoch + 2 * len(os.sched_getaffinity(0))


def test_the_prefetch_guide_asks_which_path_is_fastest_to_its_first_batch_apart():
    """Start-up is its own question (lower is better), never folded into the throughput's;
    tf.data joins the simplejpeg question as it does the throughput's."""
    from result_rows import case_rows, frame

    from storebench.results import Results
    from storebench.studies import STUDIES

    def case(prefetcher, workers, rate, first, *, fmt="lmdb", decode="simplejpeg",
             start_method=None):
        method = {"start_method": start_method} if start_method else {}
        return case_rows("prefetch", f"epoch:{fmt}/{prefetcher}/{workers}",
                         {"samples_per_s": [rate] * 5, "time_to_first_batch_s": first},
                         format=fmt, encoding="jpeg", loader="lazy", prefetcher=prefetcher,
                         workers=workers, access="shuffle", cache="warm", batch_size=256,
                         params={"decode": decode, **method})

    df = frame(case("thread", 2, 900.0, [0.010, 0.011, 0.009, 0.010, 0.010]),
               case("process", 2, 1000.0, [0.100, 0.101, 0.099, 0.100, 0.100],
                    start_method="fork"),
               case("tf_data", 0, 500.0, [0.500, 0.501, 0.499, 0.500, 0.500],
                    fmt="tfrecord", decode="tf"))
    rows = STUDIES["prefetch"].guide(Results(df, {"cpus_usable": 2}))
    throughput, first = rows
    assert throughput.metric == "samples_per_s" and throughput.best.key == "process/w2/fork"
    assert first.metric == "time_to_first_batch_s" and first.lower_is_better
    assert first.question.startswith("Fastest to first batch:")
    assert [c.key for c in first.candidates] == ["thread/w2/", "process/w2/fork", "tf_data/w0/"]
    assert first.candidates[-1].label.endswith("over tfrecord-jpeg")
    # Start-up differs by start method above all: a process path names its own.
    assert [c.label for c in first.candidates][:2] == ["ThreadPrefetcher \u00d72",
                                                      "ProcessPrefetcher \u00d72 (fork)"]
    assert first.facets["question"] == "first_batch" and not first.tie


@pytest.mark.timeout(120)
def test_the_peers_case_reads_later_epochs_until_they_hold_the_steady_minimum(memmap_set):
    """Later epochs (on the same loader) are the peers case's steady state: as many as the
    case's steady_batches need, and start-up reported apart as time_to_first_batch_s."""
    from storebench.studies.peers.cases import peer_epochs_case

    per_epoch = 512 // 32
    case = loader_case(memmap_set, "process", steady=2 * per_epoch + 1,
                       params={"later_epochs_min_s": 0.0}, warmup=False)
    metrics = peer_epochs_case(case, Trial(case, 0))
    assert metrics["later_epochs"] == (3, "count")
    assert metrics["steady_batches"] == (3 * per_epoch, "count")
    assert metrics["time_to_first_batch_s"] == metrics["epoch1_first_batch_s"]
    assert metrics["steady_seconds"][0] > 0
