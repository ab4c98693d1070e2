"""The formats, lazy_vs_preloaded and prefetch grids on the ImageNet-like set: which cases
they lay out there (and that the synthetic layout is not what they lay out), the training
transform on every loader row, the knob variants each family builds, and the lazy vs
preloaded peak figure's filter of peaks too short to sample."""

from __future__ import annotations

from collections import Counter

import pytest
from result_rows import build_case, case_rows, frame

from storebench.bench.plan import family_data_dir
from storebench.formats import knob_variants
from storebench.formats.traits import KnobVariant
from storebench.studies import captions
from storebench.studies.formats import grid as formats_grid
from storebench.studies.formats import report as formats_report
from storebench.studies.grid import TRAINING_BATCH_SIZE
from storebench.studies.lazy_vs_preloaded import grid as lazy_grid
from storebench.studies.lazy_vs_preloaded import report as lazy_report
from storebench.studies.prefetch import grid as prefetch_grid
from storebench.studies.prefetch import guide as prefetch_guide
from storebench.studies.prefetch import report as prefetch_report
from storebench.studies.shared_rows import build_cost_table
from storebench.study import build_profile


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory):
    """The ci profile's ImageNet-like sets (64 images) in the formats the loader grids pick
    and one they leave out (tfrecord's raw copy)."""
    root = family_data_dir(tmp_path_factory.mktemp("data") / "ci", "imagenet")
    build_profile("ci", root, formats=["memmap", "lmdb", "rawfiles", "tfrecord"],
                  family="imagenet", knob_variants=False, progress=False)
    return root


def layout(cases):
    return Counter((c.format, c.encoding, c.loader, c.prefetcher, c.workers, c.access,
                    c.cache, c.param("decode")) for c in cases)


def test_each_family_builds_only_the_knob_variants_declared_for_it():
    imagenet = {v.name for v in knob_variants(family="imagenet")}
    synthetic = {v.name for v in knob_variants(family="synthetic")}
    assert imagenet == {"hdf5-raw-chunk_samples=1", "parquet-raw-row_group_size=64",
                        "parquet-raw-compression=zstd", "tfrecord-raw-num_shards=16"}
    assert synthetic == {v.name for v in knob_variants()}
    assert len(synthetic) == 8
    with pytest.raises(ValueError, match="families must be among"):
        KnobVariant("hdf5", "raw", (("chunk_samples", 2),), families=("photos",))


def manifest(fmt, encoding, knobs=None, *, kind="photo"):
    from storebench.formats import get_format

    return {"format": fmt, "encoding": encoding, "num_samples": 12_000,
            "knobs": {**get_format(fmt).DEFAULT_KNOBS, **(knobs or {})},
            "spec": {"kind": kind} if kind else {}}


def test_formats_reads_a_training_variant_only_on_its_knobs_measure(tmp_path):
    both = (("sequential", "cold"), ("sequential", "warm"))
    # A default build of the raw copy: random batches cold only.
    assert formats_grid.read_plan(tmp_path / "parquet-raw", manifest("parquet", "raw"),
                                  compact=False) == (*both, ("shuffle", "cold"))
    assert formats_grid.read_plan(tmp_path / "lmdb-jpeg", manifest("lmdb", "jpeg"),
                                  compact=False) == both
    cases = {
        "parquet-raw-row_group_size=64": (("shuffle", "cold"),),
        "parquet-raw-compression=zstd": (),
        "tfrecord-raw-num_shards=16": (("sequential", "cold"),),
        "hdf5-raw-chunk_samples=1": (("shuffle", "cold"),),
    }
    for name, wanted in cases.items():
        fmt, _, rest = name.partition("-raw-")
        knob, _, value = rest.partition("=")
        build = manifest(fmt, "raw", {knob: value if knob == "compression" else int(value)})
        assert formats_grid.read_plan(tmp_path / name, build, compact=False) == wanted, name
    # The synthetic sets' variants keep every read, warm random batches too.
    synthetic = manifest("parquet", "raw", {"row_group_size": 64}, kind="")
    assert formats_grid.read_plan(tmp_path / "parquet-raw-row_group_size=64", synthetic,
                                  compact=False) == (*both, ("shuffle", "cold"),
                                                     ("shuffle", "warm"))


def test_formats_leaves_out_a_variant_dropped_for_the_family(tmp_path):
    dropped = manifest("parquet", "raw", {"row_group_size": 1024})
    assert not formats_grid.built_for_family(tmp_path / "parquet-raw-row_group_size=1024", dropped)
    assert formats_grid.built_for_family(tmp_path / "parquet-raw-row_group_size=1024",
                                         {**dropped, "spec": {}})
    assert formats_grid.built_for_family(tmp_path / "parquet-raw", manifest("parquet", "raw"))


def test_formats_random_batches_of_the_training_set_are_few_and_cold(imagenet_dir):
    cases = formats_grid.grid(profile="ci", data_dir=imagenet_dir)
    random = [c for c in cases if c.function.endswith("random_read_case")]
    assert {c.format for c in random} == {"memmap", "lmdb", "rawfiles", "tfrecord"}
    assert {(c.cache, c.batch_size, c.param("random_samples")) for c in random} == {
        ("cold", 8, 64)}


def test_lazy_vs_preloaded_on_the_training_set(imagenet_dir):
    cases = lazy_grid.grid(profile="ci", data_dir=imagenet_dir)
    expected = Counter()
    for fmt, encoding in (("memmap", "raw"), ("lmdb", "raw"), ("lmdb", "jpeg"),
                          ("rawfiles", "jpeg")):
        decode = "simplejpeg" if encoding == "jpeg" else None
        for loader in ("lazy", "preloaded"):
            for cache in ("cold", "warm"):
                expected[(fmt, encoding, loader, "none", 0, "block_shuffle", cache,
                          decode)] += 1
    for access in ("sequential", "shuffle"):
        expected[("memmap", "raw", "lazy", "none", 0, access, "cold", None)] += 1
    assert layout(cases) == expected
    for case in cases:
        assert case.param("transform") == "train"
        assert case.param("ram_orders") is None
        assert case.batch_size == 8  # ci's 64 images: batch_size_for caps 32 at 8 batches
    assert TRAINING_BATCH_SIZE == 32


def test_prefetch_on_the_training_set(imagenet_dir):
    cases = prefetch_grid.grid(profile="ci", data_dir=imagenet_dir)
    by_decode = Counter(c.param("decode") for c in cases)
    assert by_decode == {None: len(prefetch_grid.COMPACT_RAW),
                         "simplejpeg": len(prefetch_grid.TRAINING_JPEG),
                         "pil": len(prefetch_grid.COMPACT_CORE),
                         "reduced": len(prefetch_grid.COMPACT_CORE),
                         "window": len(prefetch_grid.COMPACT_CORE), "tf": 1}
    for case in cases:
        assert case.param("transform") == "train", case.case_id
    raw = [c for c in cases if c.param("decode") is None]
    assert {(c.format, c.encoding) for c in raw} == {("memmap", "raw")}
    native = [c for c in cases if c.prefetcher == "tf_data"]
    assert [(c.format, c.param("shuffle_buffer")) for c in native] == [
        ("tfrecord", prefetch_grid.TRAINING_SHUFFLE_BUFFER)]
    spawn = [c for c in cases if c.param("start_method") == "spawn"]
    assert [(c.prefetcher, c.workers, c.param("decode")) for c in spawn] == [
        ("process", 2, "simplejpeg")]


def peak_case(loader, *, pss, reliable):
    return case_rows(
        "lazy_vs_preloaded", f"epoch:memmap/{loader}/warm",
        {"samples_per_s": [1000.0] * 3, "peak_pss_bytes": [pss] * 3,
         "peak_uss_bytes": [pss / 2] * 3, "peak_memory_reliable": [reliable] * 3},
        format="memmap", encoding="raw", loader=loader, prefetcher="none", workers=0,
        access="block_shuffle", cache="warm", resident=1.0)


def figure_text(fig):
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    return "\n".join([*texts, fig._suptitle.get_text() if fig._suptitle else ""])


def test_lazy_vs_preloaded_peaks_leave_out_repeats_too_short_to_sample():
    df = frame(build_case("memmap", seconds=0.5, apparent=100e6, files=1),
               peak_case("lazy", pss=50e6, reliable=1.0),
               peak_case("preloaded", pss=900e6, reliable=0.0))
    table = lazy_report.loader_table(df).set_index("loader")
    assert table.loc["lazy", "peak_pss_bytes"] == 50e6
    assert table["peak_pss_bytes"].isna()["preloaded"]
    # The figure draws the lazy peak only: no preloaded bar, so no takeaway from it.
    fig = lazy_report.plot_loader_memory(df)
    heights = [p.get_height() for ax in fig.axes for p in ax.patches if p.get_height() > 0]
    assert heights == [pytest.approx(50.0)]
    assert "Preloaded peaks" not in figure_text(fig)


def test_lazy_vs_preloaded_peak_figure_says_when_no_repeat_could_sample_a_peak():
    df = frame(peak_case("lazy", pss=50e6, reliable=0.0),
               peak_case("preloaded", pss=900e6, reliable=0.0))
    assert "too briefly to sample a peak" in figure_text(lazy_report.plot_loader_memory(df))


def test_formats_counts_a_builds_samples_from_its_row_not_a_profile_shape():
    """An ImageNet-like set has no one image shape: per-sample bytes divide by the build
    row's ``samples`` (the synthetic ci raw shape would make 1 MB of pixels 325 samples)."""
    rows = case_rows("formats", "build:rawfiles-jpeg", {
        "write_seconds": [1.0], "bytes_apparent": [1.2e6], "bytes_allocated": [1.5e6],
        "raw_bytes": [1e6], "size_ratio": [1.2], "file_count": [10], "samples": [10]},
        format="rawfiles", encoding="jpeg")
    df = frame(rows)
    assert formats_report.allocated_per_sample(df, "rawfiles-jpeg").median == 150_000.0
    table = build_cost_table(df).iloc[0]
    assert formats_report._per_sample(df, table) == 150_000.0


def training_prefetch_case(prefetcher, workers, value, *, decode=None, fmt="lmdb",
                           encoding="jpeg"):
    """A prefetch epoch as the grid writes it on the ImageNet-like set: the training
    transform in its params."""
    method = "fork" if prefetcher == "process" else None
    params = {"transform": "train", **({"decode": decode} if decode else {}),
              **({"start_method": method} if method else {})}
    return case_rows(
        "prefetch", f"epoch:{fmt}-{encoding}/{prefetcher}/{workers}/{decode}",
        {"samples_per_s": [value, value * 1.01, value * 0.99]}, format=fmt,
        encoding=encoding, loader="lazy", prefetcher=prefetcher, workers=workers,
        access="shuffle", cache="warm", batch_size=32, params=params)


def training_prefetch_frame():
    cases = [training_prefetch_case("none", 0, 2000.0, fmt="memmap", encoding="raw"),
             training_prefetch_case("thread", 2, 3000.0, fmt="memmap", encoding="raw")]
    for decode, serial in (("simplejpeg", 400.0), ("reduced", 600.0)):
        for prefetcher, workers, scale in (("none", 0, 1.0), ("thread", 2, 1.8),
                                           ("process", 2, 1.7)):
            cases.append(training_prefetch_case(prefetcher, workers, serial * scale,
                                                decode=decode))
    return frame(*cases)


def test_prefetch_findings_on_the_training_set_name_the_crop_and_the_reduced_decode():
    sentences = prefetch_report.prefetch_findings(training_prefetch_frame())
    assert any(s.startswith("memmap-raw (crop-bound, each sample through the training crop, "
                            "2 paths): one thread delivers 2.00k samples/s") for s in sentences)
    assert ("lmdb-jpeg, one thread, no prefetcher: decoding each JPEG at the smallest DCT "
            "scale that covers its training crop (decode='reduced') runs 1.50\u00d7 faster "
            "than the full simplejpeg decode (600 samples/s vs 400 samples/s).") in sentences
    fig = prefetch_report.plot_decoders(training_prefetch_frame())
    assert "each through the training crop" in fig._suptitle.get_text()
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "simplejpeg\n(releases the GIL)",
        "reduced-size DCT\n(simplejpeg, the\ncrop's scale)"]


def test_prefetch_guide_on_the_training_set_says_the_crop():
    from storebench.results import Results

    rows = prefetch_guide.guide(Results(training_prefetch_frame(), {"cpus_usable": 2}))
    questions = [row.question for row in rows]
    assert any(q.startswith("Decoded raw arrays through the training crop from a cached "
                            "memmap-raw") for q in questions)
    assert any(q.startswith("JPEG decoded with reduced-size (DCT-scaled) simplejpeg through "
                            "the training crop") for q in questions)


def test_prefetch_scaling_draws_only_panels_whose_workers_were_swept():
    unswept = prefetch_report.plot_prefetch_scaling(training_prefetch_frame())
    assert figure_text(unswept) == "no worker count was swept\n"
    swept = frame(*[training_prefetch_case("thread", w, 100.0 * w, decode="simplejpeg")
                    for w in (1, 2, 4)],
                  training_prefetch_case("thread", 2, 300.0, fmt="memmap", encoding="raw"))
    (ax,) = prefetch_report.plot_prefetch_scaling(swept).axes
    assert ax.get_title().startswith("lmdb-jpeg, simplejpeg decoder")


def test_titles_and_questions_name_the_recorded_workload():
    from storebench.results import Results

    jpeg = ("64 ImageNet-like JPEGs of many sizes, 104 KB stored per sample or 64 "
            "ImageNet-like JPEGs of many sizes, 106 KB stored per sample; read through the "
            "training crop (random resized crop to 224, flip)")
    assert captions.compact_workload(jpeg) == (
        "64 ImageNet-like JPEGs of many sizes, 104\u2013106 KB stored per sample; read "
        "through the training crop (random resized crop to 224, flip)")
    assert captions.compact_workload("no sizes here") == "no sizes here"
    df = training_prefetch_frame()
    assert captions.study_caption(df, "jpeg", {"jpeg": jpeg}, width=1000) == (
        captions.compact_workload(jpeg))
    # Without a recorded workload: the profile's caption, as before.
    assert captions.study_caption(df, "jpeg", None) == "256 samples, 64\u00d764\u00d73, jpeg"
    recorded = Results(df, {"cpus_usable": 2}, workloads={"prefetch": {"jpeg": jpeg}})
    assert captions.question_caption(recorded, "prefetch", df, "jpeg") == ""
    assert captions.question_caption(Results(df, {}), "prefetch", df, "jpeg") == (
        " (256 samples, 64\u00d764\u00d73, jpeg)")
    rows = prefetch_guide.guide(recorded)
    assert all("64\u00d764" not in row.question for row in rows if
               row.facets.get("encoding") == "jpeg")
