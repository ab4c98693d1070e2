"""Real peaks: a case's process tree's peak memory from the kernel (its memory cgroup's
high-water mark, or summed high-water RSS without one), and sampled peaks marked where the
timed region was too short to sample.

Fallback measurements run in fresh interpreters: a process's reaped-children figures and
high-water marks carry over from whatever it did before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from result_rows import case_rows, frame

from storebench.bench.case import Case
from storebench.bench.memory_budget import ENV_CGROUP_ROOT, budget_available
from storebench.bench.metrics import MIN_PEAK_SAMPLES, RegionMeasurement
from storebench.bench.runner import run_case
from storebench.cgroups import own_memory_cgroup
from storebench.results import reliable_peaks, short_peak_regions

HERE = Path(__file__).resolve().parent
MiB = 1 << 20
HELD = 200  # MiB a child allocates and touches
UNAVAILABLE = budget_available()
needs_cgroup = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"{UNAVAILABLE}")


def _run_case_rows(**env) -> dict[str, float]:
    case = Case(study="peak", function="bench_case_functions:allocating_child_case", repeats=1,
                warmup=False, timeout_s=120, params={"megabytes": HELD})
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "ok", outcome.error
    return {r["metric"]: r["value"] for r in outcome.records if r["repeat"] == 0}


def _case_cgroups() -> set[str]:
    """This process's case cgroups (another's, a study running beside the tests, come and
    go on their own)."""
    parent = own_memory_cgroup()
    return {p.name for p in parent.path.iterdir()
            if p.name.endswith("-case") and p.name.startswith(f"storebench-{os.getpid()}-")}


@needs_cgroup
@pytest.mark.timeout(180)
def test_a_case_s_kernel_peak_is_its_cgroup_s_and_counts_a_reaped_child():
    before = _case_cgroups()
    metrics = _run_case_rows()
    assert metrics["samples"] == 1.0
    assert metrics["kernel_peak_from_cgroup"] == 1.0
    assert metrics["kernel_peak_bytes"] >= HELD * MiB
    assert _case_cgroups() == before  # the case's cgroup went with it


@pytest.mark.timeout(180)
def test_without_a_cgroup_the_peak_sums_high_water_rss(tmp_path, monkeypatch):
    # A directory that is no cgroup: the runner can make none, the worker falls back.
    monkeypatch.setenv(ENV_CGROUP_ROOT, str(tmp_path))
    metrics = _run_case_rows()
    assert metrics["samples"] == 1.0
    assert metrics["kernel_peak_from_cgroup"] == 0.0
    assert metrics["kernel_peak_bytes"] >= HELD * MiB


def _fresh(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "STOREBENCH_CASE_CGROUP"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_fallback_peak_is_the_region_s_not_the_process_s_earlier_one():
    got = _fresh(f"""
        import json, multiprocessing, numpy as np
        from storebench.bench.metrics import RegionMeasurement, high_water_rss
        import os
        big = np.ones(400 * {MiB}, dtype=np.uint8); del big  # an earlier, higher peak
        earlier = high_water_rss(os.getpid())
        def hold(ready, release):
            block = np.ones({HELD} * {MiB}, dtype=np.uint8)
            ready.set(); release.wait(60)
        ctx = multiprocessing.get_context("fork")
        ready, release = ctx.Event(), ctx.Event()
        with RegionMeasurement(interval=0.01) as m:
            child = ctx.Process(target=hold, args=(ready, release)); child.start()
            ready.wait(60)
        release.set(); child.join()
        own = high_water_rss(os.getpid())
        print(json.dumps({{"earlier": earlier, "own": own, **{{k: v for k, (v, _) in
                          m.metrics().items()}}}}))
    """)
    assert got["kernel_peak_from_cgroup"] == 0.0
    assert got["kernel_peak_bytes"] >= HELD * MiB  # the live child, seen at the stop
    # The 400 MiB before the region is not in it: the marks were reset as it started.
    assert got["earlier"] >= 400 * MiB
    assert got["kernel_peak_bytes"] < got["earlier"]


def test_a_child_reaped_between_samples_still_counts():
    got = _fresh(f"""
        import json, multiprocessing, numpy as np
        from storebench.bench.metrics import RegionMeasurement
        def allocate():
            block = np.ones({HELD} * {MiB}, dtype=np.uint8)
        ctx = multiprocessing.get_context("fork")
        with RegionMeasurement(interval=60.0) as m:  # no sample while the child lives
            child = ctx.Process(target=allocate); child.start(); child.join()
        print(json.dumps({{k: v for k, (v, _) in m.metrics().items()}}))
    """)
    assert got["kernel_peak_from_cgroup"] == 0.0
    assert got["kernel_peak_bytes"] >= HELD * MiB


def test_a_region_shorter_than_five_sampling_periods_is_marked():
    with RegionMeasurement(interval=0.05) as short:
        pass
    assert short.metrics()["peak_memory_reliable"] == (0.0, "count")
    with RegionMeasurement(interval=0.005) as long:
        started = time.perf_counter()
        while time.perf_counter() - started < 4 * MIN_PEAK_SAMPLES * long.sample_gap_s:
            time.sleep(0.005)
    metrics = {name: value for name, (value, _) in long.metrics().items()}
    # The mark follows the region's own wall and sample gap (a sample that stalled after the
    # loop widens the gap), and one of 4 times the least is long enough.
    assert metrics["peak_memory_reliable"] == float(
        metrics["wall_seconds"] >= MIN_PEAK_SAMPLES * metrics["peak_memory_sample_gap_s"])
    assert metrics["peak_memory_reliable"] == 1.0


def _peak_case(case_id: str, *, wall: float, gap: float = 0.05,
               reliable: float | None = None) -> list[dict]:
    metrics = {"wall_seconds": [wall, wall], "peak_memory_sample_gap_s": [gap, gap],
               "peak_pss_bytes": [1e8, 1e8], "peak_uss_bytes": [5e7, 5e7],
               "samples_per_s": [1e3, 1e3]}
    if reliable is not None:
        metrics["peak_memory_reliable"] = [reliable, reliable]
    return case_rows("prefetch", case_id, metrics)


def test_a_figure_gets_only_the_peaks_of_regions_long_enough_to_sample():
    df = frame(_peak_case("long", wall=1.0), _peak_case("short", wall=0.02),
               _peak_case("said-short", wall=1.0, reliable=0.0),
               _peak_case("said-long", wall=0.02, reliable=1.0))
    short = short_peak_regions(df)
    assert sorted(set(short["case_id"])) == ["said-short", "short"]
    kept = reliable_peaks(df)
    peaks = kept[kept["metric"].isin(["peak_pss_bytes", "peak_uss_bytes"])]
    assert sorted(set(peaks["case_id"])) == ["long", "said-long"]
    # Nothing else is dropped.
    assert len(df) - len(kept) == 2 * 2 * 2
    assert (kept["metric"] == "samples_per_s").sum() == 8


def test_a_peak_figure_of_only_short_regions_says_why_it_draws_no_peak():
    from storebench.plots import plot_peak_memory

    df = frame(_peak_case("short", wall=0.02), _peak_case("said-short", wall=1.0,
                                                            reliable=0.0))
    fig = plot_peak_memory(df, label_column="case_id", title="peaks")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts == ["all 2 cases were timed for under five sampling periods: too briefly "
                     "to sample a peak (see kernel_peak_bytes)"]
    drawn = plot_peak_memory(frame(_peak_case("long", wall=1.0)), label_column="case_id",
                             title="peaks")
    assert not any(t.get_text().startswith(("all ", "no ")) for ax in drawn.axes
                   for t in ax.texts)
