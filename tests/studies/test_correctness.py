"""The correctness study's measures on known deliveries, and its audit of a real storebench
recipe over a small probe set (ranks included)."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from storebench.loaders import RandomResizedCropFlip
from storebench.recipes import RECIPES
from storebench.recipes.probe import CropBox, probe_pixels, recover_box
from storebench.studies.correctness import cases
from storebench.studies.correctness import grid as correctness_grid
from storebench.studies.correctness import report as correctness
from storebench.studies.correctness.measures import (
    correlated,
    count_deliveries,
    draw_correlation,
    longest_stored_run,
    pooled_correlation,
    recover_boxes,
    same_draws,
    same_order,
    sequence_matches,
    shared_draws,
    storage_rank_correlation,
)


# -- exactly once --------------------------------------------------------------------------
def test_the_counter_names_a_planted_duplicate_and_a_planted_miss():
    delivered = [0, 1, 2, 3, 3, 5, 6, 7]  # 4 missed, 3 twice
    count = count_deliveries(delivered, 8)
    assert count.duplicated == (3,) and count.missing == (4,)
    assert (count.duplicates, count.misses, count.padding) == (1, 1, 0)
    assert not count.exact
    assert count_deliveries(list(range(8)), 8).exact


def test_a_label_outside_the_set_is_unknown_not_a_sample():
    count = count_deliveries([0, 1, 2, 9], 3)
    assert count.unknown == (9,) and count.exact is False and count.misses == 0


def test_padding_that_evens_out_ranks_is_counted_apart_from_duplicates():
    # 10 samples over 3 ranks: shares of 4, two samples delivered twice to even them out.
    shares = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    count = count_deliveries(sum(shares, []), 10, per_rank=[4, 4, 4])
    assert (count.padding, count.duplicates, count.exact) == (2, 0, True)
    # A third extra copy is beyond what evening out needs: a true duplicate.
    uneven = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1, 1]]
    count = count_deliveries(sum(uneven, []), 10, per_rank=[4, 4, 5])
    assert (count.padding, count.duplicates) == (0, 3)
    # One process: no padding allowance.
    assert count_deliveries([0, 1, 1], 2).duplicates == 1


# -- shuffle measures ----------------------------------------------------------------------
def test_the_shuffle_measures_give_known_values_on_known_orders():
    n = 1000
    assert longest_stored_run(np.arange(n)) == n
    assert longest_stored_run(np.arange(n)[::-1]) == 1
    assert longest_stored_run([5, 6, 7, 0, 1, 9]) == 3
    assert longest_stored_run([]) == 0
    shards = np.concatenate([np.arange(s, s + 100) for s in np.random.default_rng(0).
                             permutation(np.arange(0, n, 100))])
    assert longest_stored_run(shards) >= 100
    assert storage_rank_correlation(np.arange(n)) == pytest.approx(1.0)
    assert storage_rank_correlation(np.arange(n)[::-1]) == pytest.approx(-1.0)
    shuffled = np.random.default_rng(1).permutation(n)
    assert abs(storage_rank_correlation(shuffled)) < 0.1
    assert longest_stored_run(shuffled) <= 3


# -- draws ---------------------------------------------------------------------------------
def boxes_of(seed: int, count: int) -> list[CropBox]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        width, height = rng.uniform(60, 250, 2)
        out.append(CropBox(float(rng.uniform(0, 256 - width)),
                           float(rng.uniform(0, 256 - height)), float(width), float(height),
                           bool(rng.integers(2))))
    return out


def test_workers_seeded_alike_show_as_shared_draws_and_independent_ones_do_not():
    independent = boxes_of(0, 400)
    assert shared_draws(independent) == 0.0
    # Two workers with one seed: each draws the same sequence for its own samples.
    alike = boxes_of(3, 200) * 2
    assert shared_draws(alike) == 1.0


def test_ranks_drawing_one_sequence_match_and_correlate():
    a, b = boxes_of(1, 500), boxes_of(2, 500)
    assert sequence_matches(a, a) == 1.0 and sequence_matches(a, b) == 0.0
    assert draw_correlation(a, a) == pytest.approx(1.0)
    r, values = pooled_correlation([(a, b)])
    assert values == 2500 and not correlated(r, values)
    # One of six pairs drawing alike still shows.
    streams = [boxes_of(s, 500) for s in range(3)] + [boxes_of(0, 500)]
    pairs = [(x, y) for i, x in enumerate(streams) for y in streams[i + 1:]]
    r, values = pooled_correlation(pairs)
    assert r > 0.1 and correlated(r, values)
    # A short epoch's noise alone is not called correlated.
    assert not correlated(0.07, 500)


def test_same_draws_and_same_order_compare_by_sample_and_position():
    first = dict(enumerate(boxes_of(4, 50)))
    assert same_draws(first, first) == (1.0, 50)
    moved = {k: CropBox(b.left + 3, b.top, b.width, b.height, b.flipped)
             for k, b in first.items()}
    assert same_draws(first, moved)[0] == 0.0
    assert same_order([1, 2, 3, 4], [1, 2, 4, 3]) == 0.5


def test_boxes_recovered_for_a_whole_batch_are_recover_box_s():
    buffer = io.BytesIO()
    Image.fromarray(probe_pixels()).save(buffer, format="JPEG", quality=95)
    probe = np.array(Image.open(buffer))
    crop = RandomResizedCropFlip(seed=2)
    batch = np.stack([crop(probe, index=i) for i in range(16)])
    for one, many in zip((recover_box(image) for image in batch), recover_boxes(batch)):
        assert one.flipped == many.flipped
        assert np.allclose((one.left, one.top, one.width, one.height),
                           (many.left, many.top, many.width, many.height), atol=1e-6)


def test_the_pixel_tag_reads_back_through_a_jpeg():
    tags = []
    for index in (0, 5, 31, 32, 77):
        pixels = probe_pixels()
        pixels[..., 2] = cases.pixel_tag(index)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
        tags.append(int(cases.read_tags(np.array(Image.open(buffer))[None])[0]))
    assert tags == [0, 5, 31, 0, 77 % cases.TAG_LEVELS]


# -- a real recipe -------------------------------------------------------------------------
SAMPLES = 48


@pytest.fixture(scope="module")
def thread_audit():
    recipe = RECIPES["storebench-thread-lmdb"]
    with cases.probe_set(recipe, SAMPLES) as root:
        yield cases.audit_recipe(recipe, str(root), SAMPLES, batch_size=8,
                                 rank_counts=(3,), worker_counts=(1, 2))


@pytest.mark.timeout(120)
def test_a_storebench_recipe_delivers_every_sample_once_at_3_ranks(thread_audit):
    metrics = {name: value for name, (value, _) in thread_audit.items()}
    # 48 samples split over 3 ranks divide: no padding; every sample once.
    for setting in ("ranks3", "workers1", "workers2"):
        assert metrics[f"exactly_once.{setting}.duplicates"] == 0, setting
        assert metrics[f"exactly_once.{setting}.misses"] == 0, setting
        assert metrics[f"exactly_once.{setting}.tag_mismatches"] == 0, setting
    assert metrics["randomness.ranks3.sequence_match_max"] == 0.0
    assert metrics["randomness.epochs.same_draws"] == 0.0
    assert metrics["randomness.workers2.shared_draws"] == 0.0
    # Forgetting set_epoch repeats the epoch; a second run of the seed repeats the first.
    assert metrics["randomness.no_set_epoch.same_draws"] == 1.0
    assert metrics["determinism.same_workers.same_order"] == 1.0
    assert metrics["determinism.other_workers.same_draws"] == 1.0


def test_the_table_reads_the_audit_as_passing(thread_audit):
    rows = [{"study": "correctness", "case_id": "audit:lmdb-jpeg/thread/recipe=x",
             "run_id": "r1", "repeat": 0, "metric": name, "value": value, "unit": unit,
             "status": "ok", "error": "", "prefetcher": "thread",
             "params": json.dumps({"recipe": "storebench-thread-lmdb"})}
            for name, (value, unit) in thread_audit.items()]
    table = correctness.correctness_table(pd.DataFrame(rows))
    row = table.iloc[0]
    assert row["exactly_once"] == "pass" and "3 ranks" in row["exactly_once_text"]
    assert row["randomness"] == "pass" and "repeats the last one's" in row["randomness_text"]
    assert row["determinism"] == "pass"
    assert row["resume"] == "not run"
    # The thread recipe's workers are threads: no worker process to kill, and the table
    # says so rather than passing or failing it.
    assert row["killed_worker"] == "threads"


@pytest.mark.timeout(120)
def test_killing_a_process_worker_mid_epoch_stops_the_epoch_with_an_error():
    recipe = RECIPES["storebench-process-lmdb"]
    with cases.probe_set(recipe, 64) as root:
        metrics = {name.split(".")[-1]: value for name, (value, _) in
                   cases.killed_worker_metrics(recipe, str(root), 64, batch_size=8).items()}
    # Two worker processes found; the one killed after 16 samples makes the epoch raise,
    # and nothing delivered before it is repeated or foreign.
    assert metrics["worker_processes"] == 2 and metrics["delivered_before_kill"] == 16
    assert metrics["raised"] == 1 and metrics["hung"] == 0
    assert metrics["duplicates"] == 0 and metrics["unknown"] == 0
    assert 16 <= metrics["delivered"] < 64


def test_a_killed_worker_s_outcome_fails_a_silent_loss_or_a_hang_only():
    def values(**measures):
        return {f"killed_worker.workers{cases.REFERENCE_WORKERS}.{k}": float(v)
                for k, v in measures.items()}

    loud = correctness.killed_worker_outcome(values(hung=0, worker_processes=2,
                                                    delivered_before_kill=16, raised=1,
                                                    delivered=24, duplicates=0, misses=40))
    assert loud.verdict == "pass" and "stopped with an error after 24" in loud.text
    silent = correctness.killed_worker_outcome(values(hung=0, worker_processes=2,
                                                      delivered_before_kill=16, raised=0,
                                                      delivered=56, duplicates=0, misses=8))
    assert silent.verdict == "fail" and "carried on without an error, 8 missed" in silent.text
    hung = correctness.killed_worker_outcome(values(hung=1, timeout_s=120))
    assert hung.verdict == "fail" and hung.text.startswith("hung")
    whole = correctness.killed_worker_outcome(values(hung=0, worker_processes=2,
                                                     delivered_before_kill=16, raised=0,
                                                     delivered=64, duplicates=0, misses=0))
    assert whole.verdict == "pass" and "every sample exactly once" in whole.text
    assert correctness.killed_worker_outcome({}).verdict == "not run"


def test_a_planted_duplicate_fails_the_table_and_names_the_setting():
    values = {"exactly_once.ranks3.duplicates": 2.0, "exactly_once.ranks3.padding": 1.0,
              "exactly_once.workers1.misses": 1.0}
    outcome = correctness.exactly_once_outcome(values)
    assert outcome.verdict == "fail"
    assert "3 ranks: 2 duplicated" in outcome.text and "1 worker: 1 missed" in outcome.text
    assert "1 padding at 3 ranks, counted apart" in outcome.text


def test_resume_rows_join_by_loader_path():
    def row(path, prefetcher, scenario, metric, value, status="ok", error="", method=None):
        params = {"path": path, "scenario": scenario, **({"start_method": method}
                                                         if method else {})}
        return {"study": "resume", "case_id": f"resume:{path}/{scenario}", "run_id": "r",
                "repeat": 0, "metric": metric, "value": value, "status": status,
                "error": error, "prefetcher": prefetcher, "params": json.dumps(params)}

    df = pd.DataFrame([
        row("process_fork", "process", "same_workers", "lost", 0, method="fork"),
        row("process_fork", "process", "ranks_3_to_2", "duplicated", 2, method="fork"),
        row("thread", "thread", "same_workers", "lost", 0),
        row("webdataset", "webdataset", "same_workers", "case_seconds", 0.1, "skipped",
            "unsupported: no state"),
    ])
    outcomes = correctness.resume_outcomes(df)
    assert correctness.resume_for(RECIPES["storebench-process-lmdb"], outcomes).verdict == "fail"
    assert correctness.resume_for(RECIPES["storebench-thread-lmdb"], outcomes).verdict == "pass"
    assert correctness.resume_for(RECIPES["webdataset"], outcomes).verdict == "skipped"
    assert correctness.resume_for(RECIPES["tf-data-tfrecord"], outcomes).verdict == "not run"


def test_the_grid_has_one_audit_per_recipe_and_each_runs_ranks(tmp_path):
    assert [c.param("recipe") for c in correctness_grid.grid(profile="small",
                                                             data_dir=tmp_path)] == list(RECIPES)
    grid = correctness_grid.grid(profile="ci", data_dir=tmp_path)
    # The compact plan audits one recipe of an engine each run starts (Ray), not each.
    ray = [name for name, recipe in RECIPES.items() if "ray" in recipe.path.libraries]
    assert len(ray) > 1
    assert [c.param("recipe") for c in grid] == [name for name in RECIPES
                                                 if name not in ray[1:]]
    assert all(c.function.endswith(":audit_case") and c.param("rank_counts") == "3"
               for c in grid)
    assert all(c.param("environment") == "peers" for c in grid
               if RECIPES[c.param("recipe")].environment == "peers")


def test_a_case_that_failed_reads_as_an_error_not_as_a_failed_property():
    rows = pd.DataFrame([{
        "study": "correctness", "case_id": "audit:lmdb-jpeg/thread/recipe=x", "run_id": "r1",
        "repeat": -1, "metric": "case_seconds", "value": 0.0, "unit": "s",
        "status": "failed", "prefetcher": "thread",
        "error": "Traceback (most recent call last):\n  ...\nRuntimeError: boom",
        "params": json.dumps({"recipe": "storebench-thread-lmdb"})}])
    table = correctness.correctness_table(rows)
    assert len(table) == 1
    for prop in ("exactly_once", "randomness", "determinism", "shuffle"):
        assert table[prop].iloc[0] == "error"
        assert table[prop + "_text"].iloc[0] == "failed: RuntimeError: boom"


def test_a_rank_that_got_nothing_is_left_out_of_the_rank_comparisons():
    """A library that hands out whole files may give a rank nothing: the ranks that
    delivered are compared, and with fewer than two of them no comparison is made up."""
    rng = np.random.default_rng(0)

    def share(labels):
        boxes = [CropBox(float(rng.uniform(0, 50)), float(rng.uniform(0, 50)),
                         float(rng.uniform(10, 100)), float(rng.uniform(10, 100)),
                         bool(rng.integers(2))) for _ in labels]
        return cases.Delivered(list(labels), boxes)

    two = cases.rank_metrics(3, [share(range(0, 60)), share(range(60, 120)), share([])], 120)
    assert np.isfinite(two["randomness.ranks3.sequence_match_max"][0])
    assert np.isfinite(two["randomness.ranks3.draw_correlation"][0])
    assert two["exactly_once.ranks3.misses"][0] == 0
    one = cases.rank_metrics(3, [share(range(120)), share([]), share([])], 120)
    assert "randomness.ranks3.sequence_match_max" not in one
    assert "randomness.ranks3.draw_correlation" not in one
    assert one["randomness.ranks3.draw_correlation_values"] == (0, "count")
    assert all(np.isfinite(value) for value, _ in one.values())
