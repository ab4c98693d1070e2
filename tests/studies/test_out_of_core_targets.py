"""The out_of_core study's targets and findings on the ImageNet-like set: the cold-read
target over undecoded reads only, the decoding path's rate kept out of core against its own
with the set cached, and the limits each names, computed from chosen rows; the grid that
lays out their cases."""

from __future__ import annotations

import pytest
from result_rows import case_rows, frame

from storebench.report import targets
from storebench.results import Results
from storebench.studies.out_of_core import study as ooc

LIMIT_GBPS = 2.0


def epochs(fmt, encoding, access, k, *, rate, mbps, device, seconds=1.0, params=None,
           repeats=5):
    """One out_of_core case's rows: its last epoch's rate, MB/s, device bytes and time."""
    params = {"k": k, **(params or {})}
    name = "/".join(f"{key}={value}" for key, value in sorted(params.items()))
    rates = rate if isinstance(rate, list) else [rate] * repeats
    return case_rows("out_of_core", f"out_of_core_epochs:{fmt}-{encoding}/{access}/{name}", {
        "epoch1.samples_per_s": rates,
        "epoch2.samples_per_s": rates,
        "epoch2.read_MBps": [mbps] * repeats,
        "epoch2.device_read_bytes": [device] * repeats,
        "epoch2.seconds": [seconds] * repeats,
    }, format=fmt, encoding=encoding, loader="lazy", prefetcher="thread", workers=2,
        batch_size=64, access=access, cache="cold", params=params)


DECODED = {"decode": "simplejpeg", "transform": "train"}


def training_frame(*, undecoded_jpeg_rate=3000.0):
    return frame(
        # Raw arrays, undecoded: memmap reads 3x the bytes it delivers (read-around), LMDB
        # about what it delivers.
        epochs("memmap", "raw", "shuffle", 5, rate=1000.0, mbps=150.0, device=450e6),
        epochs("lmdb", "raw", "shuffle", 5, rate=2000.0, mbps=300.0, device=330e6),
        epochs("lmdb", "raw", "shuffle", 0, rate=9000.0, mbps=1350.0, device=0.0),
        # The JPEG set read undecoded at k = 5, and decoded: cached at no cap and from cold.
        epochs("lmdb", "jpeg", "shuffle", 5, rate=undecoded_jpeg_rate,
               mbps=undecoded_jpeg_rate * 0.105, device=undecoded_jpeg_rate * 0.105e6),
        epochs("lmdb", "jpeg", "shuffle", 0, rate=1000.0, mbps=20.0, device=0.0,
               params={**DECODED, "cached": True}),
        # A decoded path moves more MB/s than any undecoded one: not the cold-read target's.
        epochs("lmdb", "jpeg", "shuffle", 5, rate=[950.0, 940.0, 960.0, 955.0, 945.0],
               mbps=900.0, device=100e6, params=DECODED),
    )


def results(df):
    return Results(df, {"limits": {"cold_seq_read_GBps": LIMIT_GBPS}})


def test_the_cold_read_target_takes_the_best_undecoded_path_and_names_its_limit():
    measured = ooc.cold_read_target(results(training_frame(undecoded_jpeg_rate=1500.0)))
    # lmdb raw, 300 MB/s, beats the undecoded JPEG read (158 MB/s); the decoded path's
    # 900 MB/s does not count.
    assert measured.value == pytest.approx(300.0 / 2000.0)
    assert measured.repeats == 5
    assert "lmdb-raw, shuffle" in measured.limiting
    assert "IOPS: 2.00k samples/s random reads of 150 kB each" in measured.limiting


def test_read_around_is_named_where_the_device_reads_more_than_it_delivers():
    table = ooc.ooc_table(training_frame())
    row = table[table["label"] == "memmap-raw, shuffle"].iloc[0]
    assert ooc.read_amplification(row) == pytest.approx(3.0)
    assert ooc.io_limit_text(row).startswith("read-around: the device read 3.00\u00d7")


def test_the_decoding_target_holds_the_path_to_its_own_cached_rate():
    measured = ooc.decode_keep_target(results(training_frame()))
    assert measured.value == pytest.approx(0.95)
    assert measured.repeats == 5 and measured.low <= 0.95 <= measured.high
    assert "decode-bound: the same set read undecoded at k = 5 delivers 3.00k samples/s" in (
        measured.limiting)
    slow_io = ooc.decode_keep_target(results(training_frame(undecoded_jpeg_rate=500.0)))
    assert "I/O-bound" in slow_io.limiting


def test_the_decoding_finding_says_where_out_of_core_stops_costing_nothing():
    sentences = ooc.findings(results(training_frame()))
    decoding = [s for s in sentences if s.startswith("Decoding path over lmdb out of core")]
    assert len(decoding) == 1
    assert "95%" in decoding[0] and "decode-bound" in decoding[0]
    assert any(s.startswith("Target (Out of core: decoding path vs cached): 95%")
               for s in sentences)


def test_the_undecoded_jpeg_read_is_no_guide_candidate():
    rows = ooc.guide(results(training_frame()))
    jpeg = [row for row in rows if row.facets.get("encoding") == "jpeg"]
    assert jpeg and all("undecoded" not in c.label for row in jpeg for c in row.candidates)
    assert "decoded with the training transform" in jpeg[0].question


def test_memmap_and_lmdb_defaults_are_explained_by_read_around_from_rows():
    df = frame(
        *(epochs(fmt, "raw", "shuffle", k, rate=rate, mbps=rate * 0.15, device=device)
          for fmt, k, rate, device in (
              ("memmap", 0, 9000.0, 0.0), ("memmap", 5, 100.0, 150e6),
              ("hdf5", 0, 3000.0, 0.0), ("hdf5", 5, 900.0, 140e6))),
        epochs("memmap", "raw", "shuffle", 5, rate=800.0, mbps=120.0, device=125e6,
               params={"open_madvise_random": True}),
    )
    sentence = ooc.default_knob_findings(df)[0]
    assert sentence.startswith("memmap's default, shuffled: 9.00k samples/s where the set "
                               "fits (fastest 1 of 2), 100 samples/s at k = 5 (2 of 2)")
    assert "the device read 10\u00d7 the bytes delivered" in sentence
    assert "with madvise_random=True 1.04\u00d7" in sentence


def test_both_out_of_core_targets_are_in_the_targets_table():
    table = targets.all_targets_table(results(training_frame())).set_index("key")
    assert table.loc["out_of_core_decode_keep", "measured"]
    assert table.loc["out_of_core_decode_keep", "threshold"] == ooc.DECODE_KEEP_TARGET
    assert table.loc["out_of_core_cold_read", "value"] == pytest.approx(
        3000.0 * 0.105 / 2000.0)


def test_the_training_grid_reads_raw_undecoded_and_jpeg_both_ways(tmp_path):
    from storebench.bench.plan import family_data_dir
    from storebench.study import build_profile

    root = family_data_dir(tmp_path / "ci", "imagenet")
    build_profile("ci", root, formats=["memmap", "lmdb"], family="imagenet",
                  knob_variants=False, progress=False)
    cases = ooc.out_of_core_grid(profile="ci", data_dir=root)
    raw = [c for c in cases if c.encoding == "raw"]
    assert raw and all(not c.param("decode") and not c.param("transform") for c in raw)
    assert {c.param("k") for c in raw} == set(ooc.TRAINING_K_VALUES)
    jpeg = {(c.param("k"), bool(c.param("decode")), bool(c.param("cached"))): c
            for c in cases if c.encoding == "jpeg"}
    assert set(jpeg) == {(5, False, False), (0, True, True), (5, True, False)}
    assert jpeg[(0, True, True)].param("transform") == "train"
    # The two rates the decoding target compares are timed alike.
    assert len({(c.batch_size, c.param("epoch_seconds_limit")) for c in jpeg.values()}) == 1


def test_a_cached_start_needs_no_cap():
    from storebench.bench.case import Case, Trial
    from storebench.studies.out_of_core.cases import out_of_core_epochs_case

    case = Case(function="storebench.studies.out_of_core.cases:out_of_core_epochs_case",
                study="out_of_core", dataset="x", params={"k": 5, "cached": True})
    with pytest.raises(ValueError, match="param cached needs k = 0"):
        out_of_core_epochs_case(case, Trial(case, 0))
