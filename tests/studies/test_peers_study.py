"""The peers study's reading of its rows (targets, guide, skipped paths, shuffle quality) on
synthetic rows whose values are chosen, and the parts of its case that need no peer library."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
from result_rows import case_rows, frame

import data_gen
from storebench.bench.plan import (
    EPOCH_SAMPLES,
    PEER_SETS_DIR,
    PEER_TRAINING_SAMPLES,
    data_dir_family,
    family_data_dir,
    peer_sets_dir,
    peer_specs,
)
from storebench.results import Results
from storebench.studies.peers import study as peers
from storebench.studies.peers.cases import UNIFORM_SPREAD, shuffle_quality

RATES = {  # (path, format) -> later epochs' samples/s, five repeats
    ("process", "lmdb"): [3000.0, 3100.0, 3050.0, 3060.0, 3040.0],
    ("thread", "lmdb"): [2000.0, 2050.0, 1990.0, 2010.0, 2020.0],
    ("ffcv", "ffcv"): [2400.0, 2450.0, 2420.0, 2410.0, 2430.0],
    ("webdataset", "webdataset"): [1000.0, 1010.0, 990.0, 1005.0, 995.0],
}


def peer_case(path: str, fmt: str, values, *, encoding: str = "jpeg", cache: str = "warm",
              status: str = "ok") -> list[dict]:
    params = {"decode": "simplejpeg" if encoding == "jpeg" else None}
    metrics = {"later_epochs_samples_per_s": values,
               "epoch1_samples_per_s": [v / 2 for v in values],
               "fresh_process_first_batch_s": [0.5 if path == "ffcv" else 0.05],
               "shuffle_spread": [0.3 if path == "webdataset" else 1.0] * len(values)}
    rows = case_rows("peers", f"peer_epochs:{fmt}-{encoding}/{path}/{cache}",
                     metrics if status == "ok" else {}, params=params, format=fmt,
                     encoding=encoding, prefetcher=path, workers=2, batch_size=64,
                     access="shuffle", cache=cache)
    rows += case_rows("peers", f"peer_epochs:{fmt}-{encoding}/{path}/{cache}",
                      {"case_seconds": [1.0]}, params=params, format=fmt, encoding=encoding,
                      prefetcher=path, workers=2, batch_size=64, access="shuffle",
                      cache=cache, status=status)
    for row in rows:
        row["repeat"] = -1 if row["metric"] == "case_seconds" else row["repeat"]
        if status == "skipped":
            row["error"] = "format 'mds' needs streaming, not installed"
    return rows


def decode_target(value: float = 0.93, low: float = 0.90, high: float = 0.98, *,
                  thread: float = 5000.0, process: float = 4000.0) -> list[dict]:
    """The targets study's rows of JPEG decode against cores x one thread."""
    key = peers.DECODE_TARGET
    case_id = f"target:lmdb-jpeg/{key}"
    rows = case_rows("targets", case_id, {
        "target_ratio": [low, value, high],
        "thread_prefetcher.samples_per_s": [thread] * 3,
        "process_prefetcher.samples_per_s": [process] * 3}, loader=key, format="lmdb",
        encoding="jpeg", workers=2)
    whole = case_rows("targets", case_id, {
        "target_value": [value], "target_low": [low], "target_high": [high],
        "target_threshold": [0.85], "target_met": [1.0 if low >= 0.85 else 0.0]},
        loader=key, format="lmdb", encoding="jpeg", workers=2)
    for row in whole:
        row["repeat"] = -1
    return rows + whole


def results(*groups, cores: int = 2) -> Results:
    return Results(frame(*groups), {"cpus_usable": cores})


def all_rates(**extra):
    return [peer_case(path, fmt, values) for (path, fmt), values in RATES.items()]


def test_the_target_compares_our_best_path_with_the_best_peer():
    found = peers.best_against_peers(results(*all_rates()).df, "jpeg")
    ours, peer, (ratio, low, high) = found
    assert ours[0] == "process:lmdb" and peer[0] == "ffcv:ffcv"
    assert ratio == pytest.approx(3050 / 2420)
    assert low <= ratio <= high
    text = " ".join(peers.findings(results(*all_rates())))
    assert "ProcessPrefetcher \u00d72 (lmdb) at 3.05k samples/s" in text
    assert "FFCV Loader \u00d72 (ffcv) at 2.42k samples/s" in text
    assert "the target of 1.20\u00d7 is met" in text


def test_the_findings_say_where_storebench_stands_against_spdl():
    """Our best path against SPDL's best, and our ThreadPrefetcher against SPDL's thread
    stages (the same design), as ratios of the same run with their intervals."""
    spdl = [peer_case("spdl", "lmdb", [2500.0, 2520.0, 2490.0, 2510.0, 2505.0]),
            peer_case("spdl_process", "lmdb", [2600.0, 2610.0, 2590.0, 2605.0, 2595.0])]
    found = [s for s in peers.findings(results(*all_rates(), *spdl)) if "SPDL's" in s]
    assert len(found) == 2, found
    best, thread = found
    assert best.startswith("JPEG, warm, epochs 2 and on: storebench's best path, "
                           "ProcessPrefetcher \u00d72 (lmdb) at 3.05k samples/s, runs "
                           f"{3050 / 2600:.3f}\u00d7 SPDL's SPDL pipeline in a subprocess")
    assert f"runs {2010 / 2505:.3f}\u00d7 SPDL's SPDL pipeline (threads)" in thread
    assert "95% interval" in best and "95% interval" in thread
    assert not [s for s in peers.findings(results(*all_rates())) if "SPDL's" in s]


def decode_text(*groups) -> str:
    return next(s for s in peers.findings(results(*groups)) if "JPEG decode" in s)


def test_decode_efficiency_is_the_targets_studys_interleaved_measurement():
    """Measured once: the peers study reads the targets study's row (the prefetchers and the
    one-thread rate on each core timed in one case), naming the faster prefetcher."""
    row, faster = peers.decode_efficiency(results(*all_rates(), decode_target()).df)
    assert (row["value"], row["low"], row["high"], row["met"]) == (0.93, 0.90, 0.98, True)
    assert faster == "ThreadPrefetcher \u00d72"
    assert decode_text(*all_rates(), decode_target()) == (
        "JPEG decode from RAM through the faster prefetcher, ThreadPrefetcher \u00d72, reaches "
        "93% (95% interval 90%\u201398%, 3 repeats) of what one thread decodes on each core, "
        "summed, both timed in one case of the targets study, interleaved over the same "
        "batches; the goal of 85% is met by its interval's lower end.")
    slower_threads = decode_target(0.88, 0.80, 0.91, thread=3000.0)
    text = decode_text(*all_rates(), slower_threads)
    assert "ProcessPrefetcher \u00d72, reaches 88% (95% interval 80%" in text
    assert text.endswith("the goal of 85% is not met by its interval's lower end.")


def test_without_the_targets_studys_row_the_decode_goal_says_where_it_is_measured():
    assert decode_text(*all_rates()) == (
        "JPEG decode against cores \u00d7 one thread: not in these results; the targets study "
        "measures it (storebench run --study targets).")


def test_the_sets_are_the_profiles_first_samples_as_many_as_an_epoch_reads():
    raw, jpeg = peers.peer_specs("small")
    profile = data_gen.get_profile("small")
    assert raw.num_samples == jpeg.num_samples == EPOCH_SAMPLES == 2048
    for cut in (raw, jpeg):
        whole = profile.spec_for(cut.encoding)
        assert cut.num_samples < whole.num_samples
        assert dataclasses.replace(cut, num_samples=whole.num_samples) == whole
        for index in (0, 1234, 2047):
            (a, label_a), (b, label_b) = data_gen.sample(cut, index), data_gen.sample(whole,
                                                                                      index)
            assert label_a == label_b and np.array_equal(a, b)
    # ci: the smaller set's count, under the cap.
    assert [s.num_samples for s in peers.peer_specs("ci")] == [256, 256]
    assert peers.study_formats()[:5] == ("lmdb", "memmap", "parquet", "rawfiles", "tfrecord")
    assert set(peers.study_formats()[5:]) == set(peers.peer_formats())


def test_the_grid_reads_sets_cut_to_one_count_from_their_own_directory(ci_data_root):
    from storebench.formats import read_manifest

    cases = peers.peers_grid(profile="ci", data_dir=ci_data_root)
    assert {c.encoding for c in cases} == {"raw", "jpeg"}
    assert {Path(c.dataset).parent for c in cases} == {ci_data_root / PEER_SETS_DIR}
    for case in cases:
        if case.function.endswith(":peer_epochs_case"):
            assert read_manifest(case.dataset)["num_samples"] == 256, case.case_id
    (memmap,) = {c.dataset for c in cases if c.prefetcher == "process" and c.format == "memmap"}
    assert memmap == str(ci_data_root / PEER_SETS_DIR / "memmap-raw")


def test_the_captions_give_the_sets_read():
    """The ci profile's raw set holds 512 samples; the rows' epochs read 256."""
    cut = case_rows("peers", "peer_epochs:memmap-raw/process/warm",
                    {"samples": [256.0] * 3, "later_epochs_samples_per_s": [9e3] * 3},
                    format="memmap", encoding="raw", prefetcher="process", workers=2,
                    batch_size=64, access="shuffle", cache="warm")
    rows = peers.peers_rows(results(cut, *all_rates()).df)
    assert peers.sets_caption(rows, "raw") == "256 samples, 32\u00d732\u00d73, raw"
    # Rows without the count (older runs'): the profile's.
    assert peers.sets_caption(rows, "jpeg") == "256 samples, 64\u00d764\u00d73, jpeg"
    rows = peers.peers_rows(results(*all_rates(), peer_case("process", "memmap", [9e3] * 3,
                                                           encoding="raw")).df)
    assert peers.sets_caption(rows, "raw") == "512 samples, 32\u00d732\u00d73, raw"


def test_the_peers_grid_measures_no_decode_rate_of_its_own(ci_data_root):
    cases = peers.peers_grid(profile="ci", data_dir=ci_data_root)
    assert cases and all(case.function.endswith(":peer_epochs_case")
                         or case.function.endswith(":missing_dataset_case") for case in cases)


def test_the_guide_takes_every_measured_path_and_lists_skipped_ones():
    rows = all_rates() + [peer_case("mds", "mds", [], status="skipped"),
                          peer_case("process", "lmdb", [900.0, 950.0, 920.0], cache="cold"),
                          peer_case("webdataset", "webdataset", [800.0, 810.0, 790.0],
                                    cache="cold")]
    res = results(*rows)
    guide = peers.guide(res)
    warm = next(row for row in guide if "warm cache, epochs 2 and on" in row.question)
    assert [c.key for c in warm.candidates] == [
        "process:lmdb", "ffcv:ffcv", "thread:lmdb", "webdataset:webdataset"]
    cold = next(row for row in guide if "cold cache, epoch 1" in row.question)
    assert [c.key for c in cold.candidates] == ["process:lmdb", "webdataset:webdataset"]
    assert peers.skipped_paths(res.df) == [
        ("MDS StreamingDataset + DataLoader \u00d72 (mds), jpeg",
         "skipped: format 'mds' needs streaming, not installed")]
    assert any(line.startswith("Not measured: MDS") for line in peers.findings(res))


def test_the_table_names_each_path_s_decoder_and_shuffle():
    table = peers.peers_table(results(*all_rates()).df)
    by_label = table.set_index("label")
    assert by_label.loc["FFCV Loader \u00d72 (ffcv)", "decoder"].startswith("ffcv")
    assert by_label.loc["ProcessPrefetcher \u00d72 (lmdb)", "decoder"] == "simplejpeg"
    assert "buffer" in by_label.loc["WebDataset + DataLoader \u00d72 (webdataset)", "shuffle"]
    assert list(table["label"])[0] == "ProcessPrefetcher \u00d72 (lmdb)"  # best first


def test_shuffle_quality_tells_a_permutation_from_a_buffer():
    n = 4000
    stored = np.arange(n)
    assert shuffle_quality(stored, n)[0] == pytest.approx(1.0)
    permutation = np.random.default_rng(0).permutation(n)
    correlation, spread = shuffle_quality(permutation, n)
    assert correlation < 0.05 and spread == pytest.approx(1.0, abs=0.05)
    # A 100-sample shuffle buffer over stored order: neighbours stay close.
    rng = np.random.default_rng(1)
    buffer, out = list(range(100)), []
    for i in range(100, n):
        out.append(buffer.pop(rng.integers(len(buffer))))
        buffer.append(i)
    out += list(rng.permutation(buffer))
    correlation, spread = shuffle_quality(np.array(out), n)
    assert correlation > 0.95 and spread < 0.1
    assert pytest.approx(1 - 1 / math.sqrt(2)) == UNIFORM_SPREAD


def test_the_grid_runs_peer_cases_in_the_peers_environment_with_no_warm_up(ci_data_root):
    cases = peers.peers_grid(profile="ci", data_dir=ci_data_root)
    epochs = [c for c in cases if c.function.endswith(":peer_epochs_case")
              or c.function.endswith(":missing_dataset_case")]
    assert epochs and not any(c.warmup for c in epochs)
    for case in epochs:
        # Ray Data lives in the main environment, whatever format it reads.
        needs_peers = case.prefetcher not in ("process", "thread", "torch", "tf_data",
                                              *peers.RAY_DATA_PATH_NAMES) or (
            case.format in peers.peer_formats()
            and case.prefetcher not in peers.RAY_DATA_PATH_NAMES)
        assert (case.param("environment") == "peers") == needs_peers, case.case_id


def test_a_peer_whose_library_is_missing_is_a_skipped_row_saying_so(
        ci_data_root, monkeypatch):
    """Laid out over data the main environment built (no FFCV there), the FFCV case runs
    and reports why it was not measured: a skipped row, not an error."""
    from storebench.bench.runner import run_case
    from storebench.formats import unavailable_reason

    if unavailable_reason("ffcv") is None:
        pytest.skip("this interpreter has ffcv: its dataset would be built")
    monkeypatch.setenv("STOREBENCH_PEERS_PYTHON", sys.executable)  # lacks ffcv too
    cases = peers.peers_grid(profile="ci", data_dir=ci_data_root)
    (ffcv,) = [c for c in cases if c.format == "ffcv" and c.encoding == "jpeg"]
    assert ffcv.function.endswith(":missing_dataset_case")
    outcome = run_case(ffcv)
    assert outcome.status == "skipped", outcome.error
    assert outcome.error.startswith("loader path 'ffcv' needs ffcv, not installed in")


def test_the_warm_target_rows_get_a_longer_repeat_budget(ci_data_root, monkeypatch):
    """The default plan: the warm paths the targets compare (ours, the frameworks', each
    peer's own pipeline) get the target budget; our loader over peer formats and the cold
    rows the plan's."""
    from storebench.bench import plan

    monkeypatch.setitem(plan.PLANS, "ci", plan.StudyPlan())
    cases = [c for c in peers.peers_grid(profile="ci", data_dir=ci_data_root)
             if c.function.endswith(":peer_epochs_case")]
    assert cases
    for case in cases:
        over_peer_format = (case.prefetcher == peers.OUR_LOADER_OVER_PEER_FORMATS
                            and case.format in peers.peer_formats())
        budgeted = case.cache == "cold" or over_peer_format
        assert case.repeat_budget_s == (
            plan.REPEAT_BUDGET_S if budgeted else peers.TARGET_REPEAT_BUDGET_S), case.case_id
    assert {c.cache for c in cases} == {"warm", "cold"}


def test_a_cold_row_times_epoch_1_only_and_a_warm_row_the_later_epochs(ci_data_root,
                                                                      monkeypatch):
    """The default plan's cold rows stop after epoch 1 (their later epochs would read a
    cached set: the warm row's measurement); warm rows still time the later epochs. Run for
    real, one repeat each, through our ProcessPrefetcher over the ci LMDB JPEG set."""
    import dataclasses

    from storebench.bench import plan
    from storebench.bench.runner import run_case

    monkeypatch.setitem(plan.PLANS, "ci", plan.StudyPlan())
    cases = {c.cache: c for c in peers.peers_grid(profile="ci", data_dir=ci_data_root)
             if c.function.endswith(":peer_epochs_case") and c.prefetcher == "process"
             and c.format == "lmdb" and c.encoding == "jpeg"}
    assert cases["cold"].param("later_epochs") is False
    assert cases["warm"].param("later_epochs") is None
    measured = {}
    for cache, case in cases.items():
        outcome = run_case(dataclasses.replace(case, repeats=1, min_repeats=None))
        assert outcome.status == "ok", outcome.error
        measured[cache] = {r["metric"]: r["value"] for r in outcome.records if r["repeat"] == 0}
    cold, warm = measured["cold"], measured["warm"]
    assert cold["later_epochs"] == 0 and cold["epoch1_samples_per_s"] > 0
    assert "later_epochs_samples_per_s" not in cold and "epoch2_first_batch_s" not in cold
    assert warm["later_epochs"] >= 1 and warm["later_epochs_samples_per_s"] > 0


def test_a_failed_peer_build_names_every_format_it_left_unbuilt(tmp_path, capfd):
    from storebench.environments import EnvironmentUnavailableError, python_for

    try:
        python_for("peers")
    except EnvironmentUnavailableError as err:
        pytest.skip(str(err))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    peers.prepare(profile="ci", data_dir=blocked / "ci", progress=False, jobs=2)
    err = capfd.readouterr().err
    failures = [line for line in err.splitlines() if "peers study: building" in line]
    assert len(failures) == 2  # one line per process, each building both sets
    named = [name for line in failures
             for name in line.split("building ")[1].split(" failed")[0].split(", ")]
    assert sorted(named) == sorted(peers.study_formats())
    assert all(line.endswith("their rows will be skipped") for line in failures)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children_before


# -- on a training-set family (the ImageNet-like JPEGs and their 224x224 raw copy) -----------


def test_a_training_family_s_sets_are_its_first_images_cut_to_the_training_count():
    raw, jpeg = peer_specs("small", "imagenet")
    assert (raw.num_samples, jpeg.num_samples) == (PEER_TRAINING_SAMPLES,) * 2
    assert raw.to_dict()["kind"] == jpeg.to_dict()["kind"] == "photo"
    assert (raw.height, raw.width) == (224, 224)
    # ci's ImageNet-like family has fewer images than the cut: all of them.
    assert [s.num_samples for s in peer_specs("ci", "imagenet")] == [64, 64]
    # The synthetic sets keep their cut.
    assert [s.num_samples for s in peer_specs("ci")] == [256, 256]


def test_a_data_directory_names_its_family(tmp_path):
    assert data_dir_family(family_data_dir(tmp_path, "imagenet")) == "imagenet"
    assert data_dir_family(family_data_dir(tmp_path, "synthetic")) == "synthetic"


def training_grid(tmp_path):
    """The grid over a directory of the ci ImageNet-like family with no peer set built:
    every case is planned, those whose set is missing as skipped rows."""
    from storebench.study import build_profile

    data_dir = family_data_dir(tmp_path, "imagenet")
    build_profile("ci", data_dir, formats=["lmdb"], encodings=["raw"], family="imagenet",
                  knob_variants=False, progress=False)
    return peers.peers_grid(profile="ci", data_dir=data_dir)


def test_on_a_training_family_every_path_applies_the_training_transform(tmp_path):
    cases = training_grid(tmp_path)
    wanted = [(enc, path, fmt, "") for enc in peers.ENCODINGS
              for path, fmt in peers.TRAINING_PATHS[enc]]
    wanted[len(peers.TRAINING_PATHS["jpeg"]):len(peers.TRAINING_PATHS["jpeg"])] = [
        ("jpeg", "thread", "lmdb", "window"), ("jpeg", "thread", "lmdb", "window+plain")]
    assert [(c.encoding, c.prefetcher, c.format, peers.variant_of(dict(c.params or {})))
            for c in cases] == wanted
    assert {c.cache or c.param("cache_wanted") for c in cases} == {"warm"}
    assert {c.param("transform") for c in cases} == {"train"}
    # The library's own crop op where it has one, labelled; storebench's seeded crop else,
    # resized with Pillow for the peers and the default, as torchvision's transforms do.
    own = {(c.prefetcher, c.encoding) for c in cases if c.param("crop") == "library"}
    assert own == {("dali_file", "jpeg"), ("ffcv", "jpeg"), ("ffcv", "raw"),
                   ("tf_data", "jpeg")}
    pillow = {c.prefetcher for c in cases if c.param("crop_resampler") == "pillow"}
    assert pillow == {"torch", "webdataset", "litdata", "mds", "spdl", "ray_data_files"}
    # Read from the family's own peers directory.
    assert {str(peer_sets_dir(family_data_dir(tmp_path, "imagenet")))} == {
        c.dataset.rsplit("/", 1)[0] for c in cases}


def test_the_synthetic_grid_is_unchanged_by_the_training_family(ci_data_root):
    cases = peers.peers_grid(profile="ci", data_dir=ci_data_root)
    assert not [c for c in cases if c.param("transform") or c.param("crop")]
    assert [(c.prefetcher, c.format) for c in cases] == [
        p for enc in peers.ENCODINGS for p in peers.COMPACT[enc]]


def test_a_training_family_builds_only_the_formats_its_paths_read():
    formats = peers.study_formats("imagenet")
    read = {fmt for enc in peers.ENCODINGS for _, fmt in peers.TRAINING_PATHS[enc]}
    assert set(formats) == read
    assert "lance" not in formats and "lance" in peers.study_formats()


def training_rows(path, fmt, values, *, crop=""):
    rows = peer_case(path, fmt, values)
    for row in rows:
        params = {**json.loads(row["params"]), "transform": "train"}
        params.update({"crop": crop} if crop else {})
        row["params"] = json.dumps(params)
    return rows


def test_the_target_counts_storebench_s_paths_over_its_own_formats_only():
    """Our ProcessPrefetcher over a peer's format is not storebench's best: it measures that
    format as much as our loader."""
    over_peer = peer_case("process", "webdataset", [9000.0, 9100.0, 9050.0, 9060.0, 9040.0])
    found = peers.best_against_peers(Results(frame(*all_rates(), over_peer), {}).df, "jpeg")
    assert found[0][0] == "process:lmdb"


def test_a_training_row_s_label_says_which_crop_and_the_target_its_limit():
    groups = [training_rows("process", "lmdb", [900.0, 910.0, 905.0, 906.0, 904.0]),
              training_rows("ffcv", "ffcv", [800.0, 810.0, 805.0, 806.0, 804.0],
                            crop="library")]
    df = Results(frame(*groups), {}).df
    rows = peers.peers_rows(df)
    assert set(rows["label"]) == {"ProcessPrefetcher \u00d72 (lmdb)",
                                  "FFCV Loader \u00d72 (ffcv, own crop op)"}
    measure = peers.ours_over_peers_target("jpeg")(Results(frame(*groups), {}))
    assert measure.value == pytest.approx(905 / 805)
    assert "FFCV Loader \u00d72 (ffcv, own crop op)" in measure.limiting
    assert "decode and crop every sample (the training transform)" in measure.limiting
    caption = peers.sets_caption(rows, "jpeg")
    assert "ImageNet-like JPEGs of mixed sizes" in caption and "64\u00d764" not in caption
    assert "224\u00d7224" in caption


def test_the_ray_data_target_compares_our_best_path_with_ray_data_s_best():
    rows = [*all_rates(), peer_case("ray_data_files", "rawfiles", [900.0, 910.0, 905.0]),
            peer_case("ray_data_parquet", "parquet", [1500.0, 1490.0, 1510.0])]
    ours, ray, (ratio, low, high) = peers.best_against_ray_data(results(*rows).df)
    assert ours[0] == "process:lmdb" and ray[0] == "ray_data_parquet:parquet"
    assert ratio == pytest.approx(3050 / 1500) and low <= ratio <= high
    (target,) = [t for t in peers.PEER_TARGETS if t.key == "peers_jpeg_ray_data"]
    measured = target.measure(results(*rows))
    assert measured.value == pytest.approx(ratio) and target.threshold == 1.2
    assert "Ray Data read_parquet \u00d72 (parquet)" in measured.limiting
    # Without a Ray Data row, the target is unmeasured, not met or missed.
    assert target.measure(results(*all_rates())) is None
