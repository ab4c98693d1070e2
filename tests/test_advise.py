"""``storebench advise``: situations answered from the committed reference rows. Every
expected value is read from results/reference through the query layer and the studies'
guides here, never typed in, so the table holds whatever the reference says."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from storebench.cli import main
from storebench.report import advise as adv
from storebench.results import Results, default_builds, stat
from storebench.studies import get_study

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"
IMAGENET = {"count": 1_281_167, "mean_bytes": 110e3}


@pytest.fixture(scope="module")
def reference() -> Results:
    return Results.load(REFERENCE)


@pytest.fixture(scope="module")
def guides(reference) -> dict:
    return {name: get_study(name).guide(reference)
            for name in ("lazy_vs_preloaded", "out_of_core", "prefetch", "remote")}


def rows_of(guides, study, **facets):
    return [r for r in guides[study] if all(r.facets.get(k) == v for k, v in facets.items())]


def reference_cores(reference) -> int:
    return int(reference.env.get("cpus_usable") or reference.env["cpu_count"])


def reference_bytes(reference, encoding) -> float:
    rows = default_builds(reference.study("formats"))
    where = {"format": "rawfiles", "encoding": encoding}
    return (stat(rows, "bytes_apparent", **where).median
            / stat(rows, "file_count", **where).median)


def situation(**values) -> adv.Situation:
    return adv.Situation(**{"images": "jpeg", **IMAGENET, "ram_gb": 64, "cores": 16,
                            "demand": 1800, **values})


def loader_cores(reference, row) -> float:
    """The reference's cores less what the S3 server and proxy used in ``row``'s best case:
    their CPU is never the loader's."""
    case_id = row.best.stat.sources[0][1]
    rows = reference.df[(reference.df["case_id"] == case_id) & (reference.df["status"] == "ok")
                        & (reference.df["repeat"] >= 0)]
    taken = sum(rows.loc[rows["metric"] == m, "value"].median()
                for m in ("server_cores", "proxy_cores") if (rows["metric"] == m).any())
    return float(reference_cores(reference) - taken)


def expected_busy(reference, basis_row, s: adv.Situation, bound: float = math.inf) -> tuple:
    """(per core, per accelerator, keeps busy) as the reference's rows imply them."""
    encoding = basis_row.facets.get("encoding", "jpeg")
    per_core = (basis_row.best.stat.median / loader_cores(reference, basis_row)
                * reference_bytes(reference, encoding) / s.mean_bytes)
    per_accelerator = min(per_core * s.cores / s.accelerators, bound / s.accelerators)
    return per_core, per_accelerator, bool(per_accelerator / s.demand >= adv.BUSY_HEADROOM)


def test_jpegs_on_local_disk_larger_than_ram_one_gpu_at_1800_on_16_cores(reference, guides):
    """The situation of the issue: ImageNet-sized JPEGs, 141 GB on a 64 GB node."""
    s = situation()
    assert not s.fits_in_ram
    answer = adv.advise(s, reference)
    ooc = sorted(rows_of(guides, "out_of_core", encoding="jpeg"), key=lambda r: r.facets["k"])
    row = next((r for r in ooc if r.facets["k"] >= s.ram_ratio), ooc[-1])
    assert answer.store.key == row.best.key and answer.store.study == "out_of_core"
    disk = reference.limits["cold_seq_read_GBps"] * 1e9 / s.mean_bytes
    per_core, per_accelerator, busy = expected_busy(reference, row, s, disk)
    assert answer.per_core == pytest.approx(per_core)
    assert answer.per_accelerator == pytest.approx(per_accelerator)
    assert answer.keeps_busy is busy
    assert answer.cores_needed == pytest.approx(1800 / per_core)
    # Larger than RAM, only the loader paths the out_of_core study ran answer; each faster
    # one in RAM is named in a note with why not.
    ran = set(reference.study("out_of_core")["prefetcher"].dropna())
    path = adv.loader_path_of(answer.loader)
    assert path is not None and path.name in ran
    for question in rows_of(guides, "prefetch", encoding="jpeg"):
        best = adv.loader_path_of(adv.Choice.of(question))
        if (question.best.stat.unit == "samples/s" and best is not None
                and best.name not in ran):
            assert any(note.startswith(f"not {question.best.label}, the fastest in RAM: not "
                                       "measured larger than RAM (the out_of_core study ran ")
                       for note in answer.notes), question.best.label
    text = answer.text()
    assert row.best.label in text and "measured" in text and "extrapolated" in text
    assert "storebench study --dataset data/mine" in text
    # The loudest lesson: the slowest out-of-core path is named with its rate.
    worst = row.candidates[-1]
    if row.best.stat.median / worst.stat.median >= 2:
        assert f"avoid {worst.label}" in text


def test_the_decoder_is_chosen_among_loader_rates_never_times_to_a_first_batch(
        reference, guides):
    rows = rows_of(guides, "prefetch", encoding="jpeg")
    rates = [r for r in rows if r.best.stat.unit == "samples/s"]
    assert rates and len(rates) < len(rows), "the reference asks first-batch questions too"
    _, decoder = adv._loader(reference, "jpeg")  # no situation: every decoder answers
    slowest = min(rates, key=lambda r: r.best.stat.median)
    assert decoder.unit == "samples/s"
    assert decoder.worst == slowest.facets["decode"]
    assert decoder.worst_median == slowest.best.stat.median


def test_outside_ram_the_loader_is_the_path_and_decoder_the_store_was_timed_with(reference):
    """Larger than RAM, the answer names the loader path and decoder its store's case ran,
    never a faster one measured only in RAM (which a note names)."""
    for values in ({}, {"storage": "s3", "rtt_ms": 20}):
        answer = adv.advise(situation(**values), reference)
        timed = adv.case_knobs(answer.store.evidence[0][1])
        assert answer.loader.key.startswith(timed["path"])
        assert answer.decoder.key == timed["decode"]
        assert answer.loader.runner_up is None and answer.decoder.runner_up is None


def recipe_row(reference, encoding="jpeg", resize="antialiased"):
    return [r for r in get_study("peers").guide(reference)
            if r.facets.get("encoding") == encoding and r.facets.get("cache") == "warm"
            and r.facets.get("filter") == resize][0]


def test_jpegs_that_fit_in_ram_are_answered_with_one_recipe_timed_end_to_end(reference,
                                                                              guides):
    """In RAM, store and loader are one recipe of the peers study's row (the layout it
    reads, and its reader, decoder, crop and loader), at that row's rate."""
    s = situation(count=10_000, cores=2, demand=50_000)
    answer = adv.advise(s, reference)
    row = recipe_row(reference)
    assert answer.loader.study == answer.store.study == "peers"
    assert answer.loader.key == answer.store.key == row.best.key
    assert answer.loader.label == row.best.label and answer.decoder is None
    layout = row.best.key.split(":")[1]
    assert answer.store.label == f"{layout} (in RAM)"
    assert answer.recipe is not None and answer.recipe.layout == layout
    first = rows_of(guides, "lazy_vs_preloaded", encoding="jpeg", epochs="first")[0]
    assert any(adv.Choice.of(first).text in note for note in answer.notes)
    assert number(answer, row.best.label).basis.startswith(
        f"peers study, {reference_cores(reference)} cores, median of its repeats")
    per_core, per_accelerator, busy = expected_busy(reference, row, s)
    assert answer.per_accelerator == pytest.approx(per_accelerator)
    assert answer.keeps_busy is busy
    assert answer.utilisation == pytest.approx(min(1.0, per_accelerator / 50_000))


def test_raw_arrays_have_no_decoder(reference, guides):
    s = situation(images="raw", count=20_000, mean_bytes=150_528, cores=8, accelerators=2)
    answer = adv.advise(s, reference)
    assert answer.decoder is None
    raw = recipe_row(reference, "raw")
    assert answer.loader.key == raw.best.key
    # The row's workers (2), per reference core, on 4 cores an accelerator.
    assert answer.workers == max(1, round(raw.facets["workers"] * 4
                                          / reference_cores(reference)))


def test_png_is_not_answered_from_jpeg_rates(reference, guides):
    s = situation(images="png", mean_bytes=50e3)
    if rows_of(guides, "out_of_core", encoding="png"):
        pytest.skip("the reference measured PNG out of core")
    with pytest.raises(adv.AdviceError) as refused:
        adv.advise(s, reference)
    assert str(refused.value) == (
        f"PNG: not measured (the out_of_core study of {REFERENCE} read none); nearest "
        "measured: JPEG, whose rates are not PNG's; measure yours: storebench import "
        "YOUR_IMAGE_FOLDER --out data/mine, then storebench study --dataset data/mine")


@pytest.mark.parametrize("mean_bytes", [20e3, 2e6])
def test_samples_far_from_the_measured_size_are_not_extrapolated(reference, mean_bytes):
    with pytest.raises(adv.AdviceError, match=r"^samples of .*: not measured, more than 4× "
                                              r"from the measured set's .*nearest measured"):
        adv.advise(situation(mean_bytes=mean_bytes), reference)
    low, high = reference_bytes(reference, "jpeg") / 4, reference_bytes(reference, "jpeg") * 4
    for edge in (low * 1.01, high * 0.99):
        adv.advise(situation(mean_bytes=edge), reference)


def test_busy_is_marginal_below_the_headroom_the_gpu_evidence_covers(reference):
    per_accelerator = adv.advise(situation(), reference).per_accelerator
    for headroom, verdict in ((1.3, "yes"), (1.12, "marginal"), (0.95, "marginal"),
                              (0.8, "no")):
        answer = adv.advise(situation(demand=per_accelerator / headroom), reference)
        assert answer.headroom == pytest.approx(headroom)
        assert answer.busy == verdict
        assert answer.keeps_busy is (verdict == "yes")
    text = adv.advise(situation(demand=per_accelerator / 1.12), reference).text()
    assert "marginal: the feed is 1.12× the demand, and the GPU evidence covers 1.25×" in text


def test_a_no_lists_its_remedies_largest_gain_first_a_yes_none(reference, guides):
    s = situation(storage="s3", rtt_ms=40, accelerators=4, cores=16, demand=2500)
    answer = adv.advise(s, reference)
    assert answer.busy == "no"
    gains = [r.gain for r in answer.remedies if math.isfinite(r.gain)]
    assert gains == sorted(gains, reverse=True) and len(gains) >= 3
    assert not math.isfinite(answer.remedies[-1].gain)  # capacity, not speed, comes last
    by_kind = {r.what.split(" ")[0]: r for r in answer.remedies}
    raw = [r for r in rows_of(guides, "prefetch", encoding="raw")
           if r.best.stat.unit == "samples/s"][0]
    stored = by_kind["store"]
    assert stored.kind == "measured"
    assert stored.gain == pytest.approx(raw.best.stat.median / answer.loader.median)
    # Little's law: requests in flight = requests a second x round trip, at the headroom.
    case_id = answer.store.evidence[0][1]
    per_request = stat(reference.study("remote"), "samples_per_request", case_id=case_id).median
    in_flight = math.ceil(adv.BUSY_HEADROOM * 2500 * 4 / max(per_request, 1) * 40 / 1e3)
    assert answer.in_flight == in_flight
    assert f"In flight:  about {in_flight:,} requests per node" in answer.text()
    assert by_kind["keep"].what == f"keep about {in_flight:,} requests in flight per node"
    assert "Little's law" in by_kind["keep"].detail
    assert [r.kind for r in answer.remedies if r.what.startswith("decode on the GPU")] == [
        "cited"]
    text = answer.text()
    assert "To reach 1.25× the demand (the feed is" in text and "  1. " in text
    assert adv.advise(situation(demand=10.0), reference).remedies == ()


@pytest.mark.parametrize("rtt", [0.0, 10.0, 30.0])
def test_object_storage_takes_the_nearest_measured_round_trip_at_or_beyond(
        reference, guides, rtt):
    s = situation(storage="s3", rtt_ms=rtt, nodes=4, accelerators=8, cores=64)
    answer = adv.advise(s, reference)
    remote = sorted(guides["remote"], key=lambda r: r.facets["rtt_ms"])
    row = next((r for r in remote if r.facets["rtt_ms"] >= rtt), remote[-1])
    assert answer.store.key == row.best.key
    assert answer.store.facets["rtt_ms"] == row.facets["rtt_ms"]
    _, per_accelerator, busy = expected_busy(reference, row, s)
    assert answer.per_accelerator == pytest.approx(per_accelerator)
    assert answer.keeps_busy is busy
    beyond = rtt > remote[-1].facets["rtt_ms"]
    assert any("farther than any round trip" in n for n in answer.notes) is beyond
    delivered = next(n for n in answer.numbers if n.what.startswith("what the storage"))
    assert delivered.value == pytest.approx(1800 * 8 * 4 * 110e3 / 1e6)
    assert any("own link" in a for a in answer.assumptions)


def test_nfs_is_not_answered_from_object_storage_rates(reference, guides):
    rtts = sorted({r.facets["rtt_ms"] for r in guides["remote"]})
    with pytest.raises(adv.AdviceError) as refused:
        adv.advise(situation(storage="nfs", rtt_ms=1), reference)
    assert str(refused.value) == (
        "a network file system: not measured; nearest measured: object storage (S3) at "
        f"{', '.join(f'{r:g}' for r in rtts)} ms round trips, whose rates are not a file "
        "system's; measure yours: storebench import YOUR_IMAGE_FOLDER --out data/mine, then "
        "storebench study --dataset data/mine")


def test_a_round_trip_past_twice_the_farthest_measured_is_not_extrapolated(reference, guides):
    farthest = max(r.facets["rtt_ms"] for r in guides["remote"])
    adv.advise(situation(storage="s3", rtt_ms=2 * farthest), reference)
    with pytest.raises(adv.AdviceError, match=rf"^a round trip of {2 * farthest + 1:g} ms: not "
                                              r"measured, and more than 2× the farthest"):
        adv.advise(situation(storage="s3", rtt_ms=2 * farthest + 1), reference)


def test_a_named_workload_gives_its_demand(reference):
    s = adv.situation_from(images="jpeg", **IMAGENET, ram_gb=64, cores=16,
                           workload="mlperf-resnet50-h100")
    assert s.demand == adv.WORKLOADS["mlperf-resnet50-h100"].samples_per_s
    assert "mlcommons" in adv.WORKLOADS["mlperf-resnet50-h100"].source


def test_json_is_one_object_with_the_same_answer(capsys, reference):
    args = ["advise", "--images", "jpeg", "--count", "1281167", "--mean-bytes", "110000",
            "--ram-gb", "64", "--cores", "16", "--demand", "1800", "--results", str(REFERENCE)]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"situation", "store", "loader", "busy",
                         "cores_per_accelerator_needed", "numbers", "assumptions", "notes",
                         "measured_on", "commands", "remedies", "in_flight_per_node",
                         "measured_here", "units"}
    assert data["measured_here"] is None  # nothing timed here without --measure
    answer = adv.advise(situation(), reference)
    assert data["store"]["best"] == answer.store.key
    assert data["loader"]["workers"] == answer.workers
    assert data["loader"]["decoder"]["best"] == answer.decoder.key
    assert data["busy"] == {"utilisation": answer.utilisation, "target": adv.BUSY_TARGET,
                            "keeps_busy": answer.keeps_busy, "verdict": answer.busy,
                            "headroom": answer.headroom,
                            "headroom_needed": adv.BUSY_HEADROOM,
                            "samples_per_s_per_accelerator": answer.per_accelerator,
                            "samples_per_s_per_core": answer.per_core}
    assert {n["kind"] for n in data["numbers"]} == {"measured", "extrapolated", "cited"}
    assert data["measured_on"]["run_id"] == reference.env["run_id"]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("Situation: 1,281,167 JPEG samples")


def jpeg_folder(source: Path, count: int) -> list[int]:
    """``count`` seeded noise JPEGs of about 200 x 250 (about the measured set's bytes a
    sample, so they are answered) in two class folders; their sizes in bytes."""
    sizes = []
    for i in range(count):
        folder = source / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        pixels = np.random.default_rng(i).integers(0, 255, (200 + i, 250, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        (folder / f"{i}.jpg").write_bytes(buffer.getvalue())
        sizes.append(len(buffer.getvalue()))
    return sizes


def test_dataset_reads_kind_count_and_mean_bytes_from_an_import(tmp_path, capsys):
    from storebench.importer import import_images

    source = tmp_path / "pets"
    sizes = jpeg_folder(source, 6)
    out = tmp_path / "mine"
    import_images(source, out, formats=["rawfiles"], progress=False, log=lambda line: None)
    values = adv.dataset_situation(out)
    assert values == {"images": "jpeg", "count": 6, "mean_bytes": sum(sizes) / 6}
    assert main(["advise", "--dataset", str(out), "--ram-gb", "64", "--cores", "16",
                 "--demand", "1800", "--results", str(REFERENCE)]) == 0
    text = capsys.readouterr().out
    assert f"storebench study --dataset {out}" in text
    assert "storebench import" not in text
    # The same import's samples 20x smaller: refused, pointing at the import's own study.
    err = refusal(capsys, "--dataset", str(out), "--mean-bytes", str(sum(sizes) / 6 / 20),
                  "--ram-gb", "64", "--cores", "16", "--demand", "1800",
                  "--results", str(REFERENCE))
    assert err.endswith(f"; measure yours: storebench study --dataset {out}\n")


def refusal(capsys, *args) -> str:
    assert main(["advise", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err  # one line, no traceback
    return captured.err


BASE = ("--images", "jpeg", "--count", "1000", "--mean-bytes", "110000", "--ram-gb", "64",
        "--cores", "16")


@pytest.mark.parametrize(("extra", "message"), [
    (("--workload", "resnet-on-a-toaster"),
     "storebench advise: unknown workload 'resnet-on-a-toaster'; known: mlperf-resnet50-h100"),
    (("--demand", "0"), "storebench advise: --demand must be a positive number, got 0.0"),
    (("--demand", "1800", "--accelerators", "-1"),
     "storebench advise: --accelerators must be a positive number, got -1"),
    (("--demand", "1800", "--rtt-ms", "5"),
     "storebench advise: --rtt-ms applies to --storage nfs or s3, not to local disk"),
    (("--demand", "1800", "--storage", "s3"),
     "storebench advise: --storage s3 needs --rtt-ms (the round trip to the storage, e.g. 1 "
     "within a data centre)"),
    (("--demand", "1800", "--storage", "s3", "--rtt-ms", "-2"),
     "storebench advise: --rtt-ms must be zero or more, got -2.0"),
    (("--demand", "nan"), "storebench advise: --demand must be a positive number, got nan"),
])
def test_impossible_numbers_and_unknown_workloads_are_refused(capsys, extra, message):
    assert refusal(capsys, *BASE, *extra, "--results", str(REFERENCE)) == message + "\n"


def test_zero_cores_and_missing_inputs_are_refused(capsys):
    args = [a if a != "16" else "0" for a in BASE]
    assert refusal(capsys, *args, "--demand", "1", "--results", str(REFERENCE)) == (
        "storebench advise: --cores must be a positive number, got 0\n")
    assert refusal(capsys, "--ram-gb", "64", "--cores", "2", "--demand", "1") == (
        "storebench advise: needs --images, --count, --mean-bytes (or --dataset DIR for the "
        "images)\n")


def test_results_missing_or_of_a_compact_profile_or_without_the_study_are_refused(
        capsys, tmp_path):
    missing = tmp_path / "nowhere"
    assert refusal(capsys, *BASE, "--demand", "1", "--results", str(missing)) == (
        f"storebench advise: {missing}: no such results directory\n")
    # The reference's rows relabelled as a ci run: a smoke-test plan is no reference.
    ci = tmp_path / "ci"
    ci.mkdir()
    for path in REFERENCE.glob("*.csv"):
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        frame.assign(profile="ci").to_csv(ci / path.name, index=False)
    assert refusal(capsys, *BASE, "--demand", "1", "--results", str(ci)) == (
        f"storebench advise: {ci}: results of the 'ci' profile, a compact smoke-test plan "
        "whose numbers are not a reference; use results/reference or a full study's "
        "results\n")
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "formats.csv").write_bytes((REFERENCE / "formats.csv").read_bytes())
    assert refusal(capsys, *BASE, "--demand", "1", "--results", str(partial)) == (
        f"storebench advise: {partial}: no rows of the lazy_vs_preloaded, prefetch "
        "studies this situation needs (storebench run --study lazy_vs_preloaded)\n")


def _with_tf_data(reference: Results, factor: float | None) -> Results:
    """The reference with tf.data's own pipeline ``factor`` times as fast (so it wins its
    JPEG questions, in RAM and among the loader paths), or without it (None)."""
    df = reference.df
    native = df["study"].isin(["prefetch", "peers"]) & (df["prefetcher"] == "tf_data")
    if factor is None:
        df = df[~native]
    else:
        df = df.copy()
        rates = df["metric"].isin(["samples_per_s", "later_epochs_samples_per_s"])
        df.loc[native & rates, "value"] *= factor
    return Results(df.reset_index(drop=True), reference.env, reference.directory,
                   reference.workloads)


def test_tf_data_is_named_with_its_own_decoder_and_parallelism_never_a_worker_count(
        reference):
    """A path that decodes itself and sizes its own parallelism (``LoaderPath.decoder_text``,
    ``parallelism``) is answered with those: tf.data decodes with TensorFlow, only the crop
    window, and AUTOTUNE sizes it; it reads TFRecord only, which the answer says where the
    store chosen is another format."""
    from storebench.loaders.paths import LOADER_PATHS

    tf_data = LOADER_PATHS["tf_data"]
    fast = _with_tf_data(reference, 10.0)
    # In RAM, where tf.data was measured, for a training crop that resizes as tf.data does.
    advice = adv.advise(situation(count=100_000, resize="plain"), fast)
    assert adv.loader_path_of(advice.loader) is tf_data
    assert advice.decoder.label == tf_data.decoder_text
    assert "decode_and_crop_jpeg" in advice.decoder.label
    assert advice.workers is None and advice.parallelism == tf_data.parallelism
    text = advice.text()
    assert f"decoding with {tf_data.decoder_text}" in text and "worker(s)" not in text
    assert advice.to_dict()["loader"]["workers"] is None
    assert advice.to_dict()["loader"]["parallelism"] == tf_data.parallelism
    # One recipe: the layout it was timed over is the store.
    assert advice.store.label == "tfrecord (in RAM)" and advice.store.key == advice.loader.key
    # Resizing antialiased, tf.data (which resizes plain) is never compared, nor the answer.
    antialiased = adv.advise(situation(count=100_000), fast)
    assert adv.loader_path_of(antialiased.loader) is not tf_data
    # Without it, a path our dataset decodes for is answered with its workers.
    other = adv.advise(situation(count=100_000, resize="plain"), _with_tf_data(reference, None))
    assert adv.loader_path_of(other.loader) is not tf_data
    assert other.parallelism == ""
    assert other.workers >= 1 and f"{other.workers} worker(s) per accelerator" in other.text()


def test_a_recipe_that_cannot_serve_the_situation_is_never_the_answer_there(reference):
    """tf.data, made the fastest in RAM, is the answer in RAM, with its recipe named; over
    object storage its recipe cannot serve (no S3 filesystem in this TensorFlow), so the
    answer is another path, and says why not tf.data."""
    from storebench.recipes import OBJECT_STORAGE, get_recipe

    fast = _with_tf_data(reference, 10.0)
    in_ram = adv.advise(situation(count=100_000, resize="plain"), fast)
    assert in_ram.recipe is get_recipe("tf-data-tfrecord")
    assert ("Recipe:     storebench recipes tf-data-tfrecord (its code, tuning and where it "
            "cannot serve)") in in_ram.text()
    assert in_ram.to_dict()["loader"]["recipe"] == "tf-data-tfrecord"
    remote = adv.advise(situation(storage="s3", rtt_ms=20), fast)
    assert adv.loader_path_of(remote.loader).name != "tf_data"
    why = get_recipe("tf-data-tfrecord").why_not(OBJECT_STORAGE)
    fastest = [r for r in rows_of({"prefetch": get_study("prefetch").guide(fast)}, "prefetch",
                                  encoding="jpeg") if r.best.stat.unit == "samples/s"]
    tf_best = next(r.best.label for r in fastest
                   if adv.loader_path_of(adv.Choice.of(r)).name == "tf_data")
    assert (f"not {tf_best}, the fastest in RAM: its recipe (tf-data-tfrecord) "
            f"cannot serve object storage: {why}") in remote.notes


def numeric_leaves(value, path=""):
    """(dotted path with ``[]`` for list items, key, parent, value) of every number."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numeric_leaves(item, f"{path}.{key}" if path else key) if isinstance(
                item, dict | list) else ([(f"{path}.{key}" if path else key, key, value, item)]
                                         if isinstance(item, int | float)
                                         and not isinstance(item, bool) else [])
    elif isinstance(value, list):
        for item in value:
            yield from numeric_leaves(item, f"{path}[]")


@pytest.mark.parametrize("values", [
    {},  # larger than RAM on local disk: a yes
    {"storage": "s3", "rtt_ms": 40, "accelerators": 4, "demand": 2500},  # a no, remedies
    {"images": "raw", "count": 20_000, "mean_bytes": 150_528},  # in RAM, no decoder
])
def test_every_number_in_the_json_names_its_unit(reference, values):
    """A number carries its unit beside it (a choice's median, a figure's value) or in the
    answer's ``units``; the loader and decoder comparisons are rates, never seconds."""
    data = adv.advise(situation(**values), reference).to_dict()
    units = data["units"]
    missing = [path for path, key, parent, _ in numeric_leaves(data)
               if not (key in ("median", "worst_median", "value") and parent.get("unit"))
               and path not in units]
    assert missing == []
    assert data["loader"]["unit"] == "samples/s"
    if data["loader"]["decoder"] is not None:
        assert data["loader"]["decoder"]["unit"] == "samples/s"
        if data["loader"]["decoder"]["worst"] is not None:
            assert data["loader"]["decoder"]["worst_median"] > 1  # a rate, not seconds
    assert all(n["unit"] for n in data["numbers"])


def test_an_nvme_disk_is_not_answered_from_a_virtio_disk_larger_than_ram(reference):
    assert adv.disk_kind(reference.env["storage"]) == "virtio"
    with pytest.raises(adv.AdviceError, match=r"^an NVMe SSD for a set .*: not measured; "
                                              r"nearest measured: a virtio disk"):
        adv.advise(situation(disk="nvme"), reference)
    adv.advise(situation(disk="virtio"), reference)
    in_ram = adv.advise(situation(disk="nvme", count=10_000), reference)
    assert any(note.startswith("the first epoch reads an NVMe SSD, not measured")
               for note in in_ram.notes)
    with pytest.raises(adv.AdviceError, match="--disk applies to --storage local"):
        situation(disk="nvme", storage="s3", rtt_ms=1)


def test_every_reason_a_situation_is_not_measured_is_given_at_once(reference):
    with pytest.raises(adv.AdviceError) as refused:
        adv.advise(situation(images="raw", mean_bytes=2e6, count=200_000, ram_gb=256,
                             disk="nvme"), reference)
    assert "an NVMe SSD for a set" in str(refused.value)
    assert "; also samples of 2.00 MB: not measured" in str(refused.value)


def test_public_per_core_rates_stand_beside_ours_and_a_gap_is_explained(reference, guides):
    answer = adv.advise(situation(), reference)
    cited = {n.what.split(":")[0] for n in answer.numbers if n.kind == "cited"}
    assert {a.name for a in adv.PER_CORE_ANCHORS} <= cited
    ooc = sorted(rows_of(guides, "out_of_core", encoding="jpeg"), key=lambda r: r.facets["k"])
    row = next((r for r in ooc if r.facets["k"] >= answer.situation.ram_ratio), ooc[-1])
    ours = row.best.stat.median / loader_cores(reference, row)
    far = [a for a in adv.PER_CORE_ANCHORS
           if a.high / ours > adv.ANCHOR_GAP or a.low / ours < 1 / adv.ANCHOR_GAP]
    notes = [n for n in answer.notes if n.startswith("per core at ")]
    assert len(notes) == (1 if far else 0)
    for anchor in far:
        assert f"{anchor.name} {anchor.range_text}/s is" in notes[0]
    # The one-thread rate of the same run and decoder is what tells this machine's cores.
    one = [r for r in rows_of(guides, "prefetch", encoding="jpeg", decode="simplejpeg")
           if r.best.stat.unit == "samples/s"][0]
    single = next(c for c in one.candidates if c.key.startswith("none/w0/"))
    assert any(n.kind == "measured" and n.value == single.stat.median
               for n in answer.numbers)


def test_the_s3_servers_cpu_is_never_counted_as_the_loaders(reference, guides):
    answer = adv.advise(situation(storage="s3", rtt_ms=20), reference)
    row = sorted(guides["remote"], key=lambda r: r.facets["rtt_ms"])[-1]
    taken = reference_cores(reference) - loader_cores(reference, row)
    assert 0 < taken < reference_cores(reference)
    assert any(n.unit == "cores" and n.value == pytest.approx(taken) for n in answer.numbers)
    assert answer.per_core == pytest.approx(
        row.best.stat.median / (reference_cores(reference) - taken)
        * reference_bytes(reference, "jpeg") / 110e3)


def test_a_faster_decoder_is_a_remedy_with_the_gain_our_rows_measured(reference, guides):
    answer = adv.advise(situation(storage="s3", rtt_ms=40, accelerators=4, demand=2500),
                        reference)
    rates = {r.facets["decode"]: next(c.stat.median for c in r.candidates
                                      if c.key.startswith("thread/w2/"))
             for r in rows_of(guides, "prefetch", encoding="jpeg")
             if r.best.stat.unit == "samples/s"}
    window = next(r for r in answer.remedies if r.what.startswith("decode only the crop"))
    assert window.kind == "measured"
    assert window.gain == pytest.approx(rates["window"] / rates["simplejpeg"])
    nodes = next(r for r in answer.remedies if "CPU-only node(s)" in r.what)
    assert "into each training node" in nodes.detail


# -- the capacity model: one core's calibration, scaling, CPU nodes ------------------------
def prefetch_rate(reference, prefetcher, workers, decode) -> float:
    rows = reference.study("prefetch")
    return stat(rows, "samples_per_s", prefetcher=prefetcher, workers=workers,
                encoding="jpeg", param_decode=decode).median


def number(answer, what) -> adv.Number:
    found = [n for n in answer.numbers if n.what.startswith(what)]
    assert len(found) == 1, (what, [n.what for n in answer.numbers])
    return found[0]


def test_the_rate_per_core_is_shown_raw_and_over_one_cores_full_decode(reference, guides):
    """The calibration is the same run's fastest one-thread full decode of the set; the
    rate per core is divided by it, so that machines of other core speeds compare."""
    answer = adv.advise(situation(count=10_000), reference)  # in RAM: the recipe's rate
    full = {d: prefetch_rate(reference, "none", 0, d) for d in adv.FULL_DECODERS}
    decoder, calibration = max(full.items(), key=lambda item: item[1])
    one_core = number(answer, "one thread, no prefetcher, full ")
    assert (one_core.value, one_core.kind) == (calibration, "measured")
    assert decoder in one_core.what
    raw = recipe_row(reference).best.stat.median / reference_cores(reference)
    assert number(answer, "per core at the measured set's").value == pytest.approx(raw)
    normalised = number(answer, "per core over one core's full decode")
    assert (normalised.value, normalised.unit) == (pytest.approx(raw / calibration), "ratio")
    tuned = number(answer, "tuned DataLoader over its machine's one-core decode")
    assert tuned.value == pytest.approx(adv.PER_CORE_ANCHORS[0].low / adv.DECODE_ANCHOR.high)
    assert tuned.kind == "cited"


def test_scaling_to_your_cores_states_the_one_to_two_worker_efficiency_measured_here(
        reference):
    s = situation(count=10_000)
    answer = adv.advise(s, reference)
    cores = reference_cores(reference)
    path = adv.loader_path_of(answer.loader).name
    one, many = (prefetch_rate(reference, path, w, "simplejpeg") for w in (1, cores))
    efficiency = number(answer, f"1- to {cores}-worker scaling")
    assert efficiency.value == pytest.approx(many / (cores * one))
    assert efficiency.kind == "measured"
    assumption = next(a for a in answer.assumptions if a.startswith("the rate per core "))
    assert assumption.startswith(f"the rate per core measured on {cores} cores holds on your "
                                 f"{s.cores_per_accelerator:g} per accelerator: linear "
                                 f"scaling; from 1 to {cores} workers here, ")
    assert f"{many / (cores * one):.2f} of linear (prefetch study, the same set)" in assumption
    assert "beyond 2 cores nothing here measures it" in assumption


S3_NO = {"storage": "s3", "rtt_ms": 20, "accelerators": 4, "demand": 2500, "nodes": 2}


def expected_cpu_nodes(answer, per_core) -> tuple[int, float, float]:
    s = answer.situation
    gap_per_node = (adv.BUSY_HEADROOM * s.demand - answer.per_accelerator) * s.accelerators
    nodes = math.ceil(gap_per_node * s.nodes / (per_core * s.cores))
    return (nodes, gap_per_node * adv.DECODED_SAMPLE_BYTES / 1e6,
            gap_per_node * s.nodes * adv.DECODED_SAMPLE_BYTES / nodes / 1e6)


def cpu_node_remedy(answer) -> adv.Remedy:
    return next(r for r in answer.remedies if "CPU-only node" in r.what)


def test_cpu_nodes_are_sized_from_the_gap_and_the_answers_rate_without_ray_data_rows(
        reference, monkeypatch):
    from storebench import recipes

    monkeypatch.setattr(recipes, "RECIPES", {
        name: r for name, r in recipes.RECIPES.items()
        if not name.startswith(adv.CPU_NODE_RECIPE_PREFIX)})
    answer = adv.advise(situation(**S3_NO), reference)
    assert answer.busy == "no"
    nodes, into, out = expected_cpu_nodes(answer, answer.per_core)
    remedy = cpu_node_remedy(answer)
    assert remedy.what == f"add {nodes} CPU-only node(s) of 16 cores to preprocess"
    assert remedy.kind == "extrapolated"
    assert "the answer's own rate: no ray-data recipe measured" in remedy.detail
    assert (f"{adv.format_value(into, 'MB/s')} into each training node, "
            f"{adv.format_value(out, 'MB/s')} out of each CPU node") in remedy.detail


def test_cpu_nodes_take_a_ray_data_recipes_measured_rate_where_its_rows_exist(
        reference, monkeypatch):
    """A recipe of the prefix with rows in the results sizes the nodes, and says so: here
    one standing for it over the FFCV rows of the peers study."""
    import dataclasses

    from storebench import recipes

    stand_in = dataclasses.replace(recipes.get_recipe("ffcv"), name="ray-data-stand-in")
    monkeypatch.setattr(recipes, "RECIPES", {
        **{name: r for name, r in recipes.RECIPES.items()
           if not name.startswith(adv.CPU_NODE_RECIPE_PREFIX)},
        stand_in.name: stand_in})
    answer = adv.advise(situation(**S3_NO), reference)
    rate = stat(reference.df, "later_epochs_samples_per_s", prefetcher="ffcv", format="ffcv",
                encoding="jpeg").median
    per_core = (rate / reference_cores(reference) * reference_bytes(reference, "jpeg")
                / answer.situation.mean_bytes)
    nodes, into, _ = expected_cpu_nodes(answer, per_core)
    remedy = cpu_node_remedy(answer)
    assert remedy.what.startswith(f"add {nodes} CPU-only node(s)")
    assert remedy.kind == "measured"
    assert "a core, ray-data-stand-in (peers study, " in remedy.detail
    assert f"{adv.format_value(into, 'MB/s')} into each training node" in remedy.detail


# -- advise --measure -----------------------------------------------------------------------
def jpeg_import(tmp_path, formats, count=24) -> Path:
    from storebench.importer import import_images

    source = tmp_path / "photos"
    jpeg_folder(source, count)
    out = tmp_path / "mine"
    import_images(source, out, formats=formats, progress=False, log=lambda line: None)
    return out


IN_RAM = ("--ram-gb", "64", "--cores", "16", "--demand", "1800")


def test_measure_prints_its_plan_then_a_line_per_case_and_marks_what_it_measured(
        tmp_path, monkeypatch, capsys, reference):
    """A real run on a tiny import, the runner-up's library made missing: one case runs,
    the runner-up is a skipped line with its reason, and the answer's rate is the one
    measured here, the reference's beside it."""
    from storebench.advise_measure import CASE_START_S, MEASURE_REPEATS
    from storebench.recipes import Recipe

    mine = jpeg_import(tmp_path, ["lmdb"])
    answer = adv.advise(adv.situation_from(dataset=mine, ram_gb=64, cores=16, demand=1800),
                        reference, dataset=mine)
    first, second = adv.recipes_to_measure(answer, reference)
    original = Recipe.unavailable
    monkeypatch.setattr(Recipe, "unavailable", lambda self: (
        f"recipe {self.name}: no module 'elsewhere' in this environment"
        if self.name == second.recipe.name else original(self)))
    monkeypatch.chdir(tmp_path)
    assert main(["advise", "--measure", "--dataset", str(mine), *IN_RAM,
                 "--measure-samples", "24", "--results", str(REFERENCE)]) == 0
    captured = capsys.readouterr()
    log = captured.err.splitlines()
    out = next(tmp_path.glob("results/advise-measure/*"))
    estimate = CASE_START_S + (MEASURE_REPEATS + 1) * 24 / first.reference
    assert log[:3] == [
        f"advise --measure: 1 recipe(s) on this machine, {MEASURE_REPEATS} repeats of at "
        f"most 24 samples each, in RAM, into {out.relative_to(tmp_path)}; about "
        f"{estimate:.0f} s (from the reference's rates)",
        f"  answer: recipe {first.recipe.name}, {first.workers} worker(s), over "
        f"{mine / 'lmdb-jpeg'}",
        f"  runner-up: recipe {second.recipe.name}, {second.workers} worker(s), skipped: "
        "no module 'elsewhere' in this environment",
    ]
    assert log[3].startswith("  case 1/1 ok in ") and log[3].endswith(first.recipe.name)
    rows = Results.load(out)
    assert set(rows.df["study"]) == {"recipes"}
    assert not (REFERENCE / "advise-measure").exists()
    text = captured.out
    here = next(line for line in text.splitlines() if line.startswith("  measured here "))
    assert f"recipe {first.recipe.name} (answer), in RAM" in here
    assert here.endswith(f"; the reference: "
                         f"{adv.format_value(first.reference, 'samples/s')})")
    assert (f"  skipped       recipe {second.recipe.name} (runner-up): no module 'elsewhere' "
            "in this environment") in text
    assert "; measured here: " in next(line for line in text.splitlines()
                                       if line.startswith("Load with:"))
    assert "from the rate measured here" in text


def test_measured_rates_replace_the_references_in_the_answer_and_its_json(reference):
    s = situation(count=10_000)
    answer = adv.advise(s, reference)
    mine = adv.RateHere("answer", "storebench-window-lmdb", answer.loader.median, 300.0, 3,
                        2.0, s.mean_bytes, "data/mine/lmdb-jpeg")
    here = adv.MeasuredHere((mine, adv.RateHere("runner-up", "storebench-thread-lmdb", 750.0,
                                                skipped="its reason")), "this box", "out")
    measured = adv.advise(s, reference, here=here)
    assert measured.per_core == pytest.approx(150.0)
    assert measured.per_accelerator == pytest.approx(150.0 * 16)
    per_core = number(measured, "per core at your sample size")
    assert per_core.reference == pytest.approx(answer.per_core)
    data = measured.to_dict()
    assert data["measured_here"]["measured"] is True
    assert [r["measured"] for r in data["measured_here"]["recipes"]] == [True, False]
    assert data["measured_here"]["recipes"][0]["samples_per_s"] == 300.0
    assert data["measured_here"]["recipes"][0]["reference_samples_per_s"] == (
        answer.loader.median)


@pytest.mark.parametrize("layout", [None, "empty", "rawfiles"])
def test_measure_refuses_a_dataset_it_cannot_time_in_one_line_naming_it(
        tmp_path, capsys, layout):
    if layout is None:
        target, message = tmp_path / "absent", "no such directory"
    elif layout == "empty":
        target = tmp_path / "empty"
        target.mkdir()
        message = "holds no imported dataset"
    else:
        target = jpeg_import(tmp_path, ["rawfiles"], count=8)
        message = (f"--measure: no recipe of the answer runs here: storebench-window-lmdb: "
                   f"{target / 'lmdb-jpeg'}: not in the import")
    err = refusal(capsys, "--measure", "--dataset", str(target), *IN_RAM,
                  "--results", str(REFERENCE))
    assert err.startswith("storebench advise: ") and str(target) in err and message in err


def test_measure_samples_goes_with_measure(capsys):
    assert refusal(capsys, *BASE, "--demand", "1800", "--measure-samples", "10",
                   "--results", str(REFERENCE)) == (
        "storebench advise: --measure-samples goes with --measure\n")
