"""The lazy_vs_preloaded study's tables and sentences: every number follows from the rows."""

from __future__ import annotations

import pytest
from result_rows import build_case, case_rows, frame

from storebench.results import Results
from storebench.studies.lazy_vs_preloaded import guide, report


def loader_case(fmt, loader, cache, *, throughput, first, pss):
    return case_rows(
        "lazy_vs_preloaded", f"epoch:{fmt}/{loader}/{cache}",
        {"samples_per_s": [throughput] * 3, "time_to_first_batch_s": [first] * 3,
         "preload_seconds": [first / 2] * 3, "epoch_seconds": [1.0] * 3,
         "peak_pss_bytes": [pss] * 3, "peak_uss_bytes": [pss / 2] * 3},
        format=fmt, encoding="raw", loader=loader, prefetcher="none", workers=0,
        access="block_shuffle", cache=cache, resident=1.0 if cache == "warm" else 0.0)


def loader_frame():
    return frame(
        build_case("memmap", seconds=0.5, apparent=1_000_000, files=2),
        loader_case("memmap", "lazy", "warm", throughput=1000.0, first=0.01, pss=50e6),
        loader_case("memmap", "preloaded", "warm", throughput=4000.0, first=0.05, pss=60e6),
        loader_case("memmap", "lazy", "cold", throughput=250.0, first=0.02, pss=50e6),
        loader_case("memmap", "preloaded", "cold", throughput=4000.0, first=0.2, pss=60e6),
    )


def test_lazy_vs_preloaded_findings():
    sentences = report.lazy_vs_preloaded_findings(
        loader_frame(), {"ram_bytes": 10e9}, profile_bytes={"large": 25e9})
    text = "\n".join(sentences)
    assert "the preloaded epoch runs 4.00\u00d7 the lazy one's throughput on memmap" in text
    assert "preloading delays the first batch to 200 ms on memmap against 20.0 ms" in text
    assert "preloaded minus lazy is +10.0 MB" in text
    assert ("a guest-cold cache costs lazy reading most on memmap (4.00\u00d7 slower than "
            "warm)") in text
    assert ("The largest dataset measured is memmap-raw at 1.00 MB, <0.1% of this machine's "
            "10.0 GB RAM.") in text
    assert "opt-in `large` profile (25.0 GB, 250% of RAM)" in text


def test_ram_findings_need_the_machines_ram():
    df = loader_frame()
    assert report.ram_findings(df, None) == []
    assert report.ram_findings(df, {}) == []
    # A dataset near RAM does not get the "does not show" caveat.
    near = report.ram_findings(df, {"ram_bytes": 1.5e6})
    assert near == ["The largest dataset measured is memmap-raw at 1.00 MB, 67% of this "
                    "machine's 1.50 MB RAM."]


def test_loader_table_has_one_row_per_loader_and_cache():
    table = report.loader_table(loader_frame()).set_index(["loader", "cache"])
    assert table.loc[("preloaded", "cold"), "time_to_first_batch_s"] == pytest.approx(0.2)
    assert table.loc[("lazy", "warm"), "samples_per_s"] == 1000.0
    assert table.loc[("lazy", "cold"), "resident_fraction"] == 0.0
    assert set(table["repeats"]) == {3}


def test_a_preloaded_cases_other_orders_read_as_rows_of_their_own():
    rows = case_rows(
        "lazy_vs_preloaded", "epoch:memmap/preloaded/warm",
        {"samples_per_s": [4000.0, 4200.0, 4100.0], "time_to_first_batch_s": [0.05] * 3,
         "sequential.samples_per_s": [5000.0, 5200.0, 5100.0],
         "shuffle.samples_per_s": [3000.0, 3300.0, 3100.0]},
        format="memmap", encoding="raw", loader="preloaded", prefetcher="none", workers=0,
        access="block_shuffle", cache="warm", params={"ram_orders": "sequential,shuffle"},
        resident=1.0)
    table = report.loader_table(frame(rows)).set_index("access")
    assert table.loc["block_shuffle", "samples_per_s"] == 4100.0
    assert table.loc["sequential", "samples_per_s"] == 5100.0
    assert table.loc["shuffle", "samples_per_s"] == 3100.0
    assert set(table["repeats"]) == {3}
    # The first batch is the block-shuffled epoch's: not copied to the other orders.
    assert table.loc["block_shuffle", "time_to_first_batch_s"] == 0.05
    assert table[["time_to_first_batch_s"]].loc[["sequential", "shuffle"]].isna().all().all()
    orders = report.access_order_table(frame(rows), loader="preloaded").iloc[0]
    assert orders["shuffle_vs_sequential"] == pytest.approx(3100.0 / 5100.0)
    # The guide's rows (block-shuffled epochs) are the case's own epochs only.
    picked = report.block_shuffled(frame(rows))
    assert set(picked.loc[picked["metric"] == "samples_per_s", "value"]) == {
        4000.0, 4200.0, 4100.0}


def lazy_epoch(fmt, access, cache, value, params=None):
    return case_rows("lazy_vs_preloaded", f"epoch:{fmt}/{access}/{cache}/{params}",
                     {"samples_per_s": [value] * 3, "time_to_first_batch_s": [0.01] * 3},
                     format=fmt, encoding="raw", loader="lazy", prefetcher="none", workers=0,
                     access=access, cache=cache, params=params or {},
                     resident=0.0 if cache == "cold" else 1.0)


def test_access_orders_and_readahead_knobs():
    df = frame(
        lazy_epoch("parquet", "sequential", "warm", 1000.0),
        lazy_epoch("parquet", "block_shuffle", "warm", 900.0),
        lazy_epoch("parquet", "shuffle", "warm", 100.0),
        lazy_epoch("memmap", "sequential", "warm", 2000.0),
        lazy_epoch("memmap", "block_shuffle", "warm", 2000.0),
        lazy_epoch("memmap", "shuffle", "warm", 1800.0),
        lazy_epoch("memmap", "shuffle", "cold", 500.0, {"open_madvise_random": True}),
        lazy_epoch("memmap", "shuffle", "cold", 250.0, {"open_madvise_random": False}),
    )
    orders = report.access_order_table(df).set_index("format")
    assert orders.loc["parquet", "shuffle_vs_sequential"] == pytest.approx(0.1)
    (sentence,) = report.access_order_findings(df)
    assert sentence == ("Raw arrays, warm, read lazily by one thread: a full shuffle runs at "
                        "0.10\u00d7 of sequential throughput on parquet (the worst) and "
                        "0.90\u00d7 on memmap; block shuffle brings parquet to 0.90\u00d7 of "
                        "sequential.")
    # The knob cases are not mistaken for the default memmap epochs.
    assert "cold" not in set(report.loader_table(df)["cache"])
    readahead = report.readahead_table(df).set_index("setting")
    assert readahead.loc["True", "samples_per_s"] == 500.0
    assert readahead.loc["False", "option"] == "madvise_random"
    assert report.readahead_findings(df) == [
        "memmap, guest-cold, shuffled: madvise_random=True runs 2.00\u00d7 faster than "
        "madvise_random=False (500 samples/s vs 250 samples/s)."]


def test_the_cold_first_epoch_question_counts_the_preload():
    df = loader_frame()
    warm, cold = guide.guide(Results(df, {}))
    assert warm.best.key == "memmap/preloaded" and warm.ratio == pytest.approx(4.0)
    # preload (first / 2) plus the epoch (1 s): 1.1 s preloaded against 1.01 s lazy
    assert cold.lower_is_better
    assert {c.key: c.stat.median for c in cold.candidates} == pytest.approx(
        {"memmap/lazy": 1.01, "memmap/preloaded": 1.1})
    assert cold.best.key == "memmap/lazy"


def order_case(access, *, throughput, correlation, blocks=None):
    metrics = {"samples_per_s": throughput, "shuffle.storage_rank_correlation": [correlation] * 5}
    if blocks is not None:
        metrics |= {"shuffle.distinct_blocks_per_batch": [blocks] * 5,
                    "shuffle.uniform_distinct_blocks_per_batch": [8.0] * 5,
                    "shuffle.distinct_blocks_ratio": [blocks / 8.0] * 5}
    return case_rows("lazy_vs_preloaded", f"epoch:hdf5/lazy/warm/{access}", metrics,
                     format="hdf5", encoding="raw", loader="lazy", prefetcher="none",
                     workers=0, access=access, cache="warm", resident=1.0)


def test_block_shuffle_states_its_speed_against_what_it_gives_up_in_spread():
    df = frame(order_case("block_shuffle", throughput=[300.0, 310.0, 290.0, 305.0, 295.0],
                          correlation=0.25, blocks=2.0),
               order_case("shuffle", throughput=[100.0] * 5, correlation=0.0))
    (sentence,) = report.block_shuffle_tradeoff(df)
    assert sentence.startswith("hdf5-raw, warm, one thread: block shuffle runs 3.00\u00d7 the "
                               "full shuffle's throughput (95% interval ")
    assert ("a batch draws on 2.0 blocks against 8.0 for a uniform permutation (25% of its "
            "spread), and the order's rank correlation with storage order is 0.25 (full "
            "shuffle: 0.00).") in sentence
    # A format with one block (no block measures) has no trade to state.
    single = frame(order_case("block_shuffle", throughput=[300.0] * 5, correlation=0.0),
                   order_case("shuffle", throughput=[100.0] * 5, correlation=0.0))
    assert report.block_shuffle_tradeoff(single) == []


def test_the_ram_caveat_points_at_out_of_core_rows_where_the_results_have_them():
    env = {"ram_bytes": 10e9}
    alone = report.ram_findings(loader_frame(), env)
    assert alone[-1].startswith("So these results do not show what happens as a dataset "
                                "approaches or passes RAM")
    beyond = frame(*[loader_case("memmap", "lazy", "warm", throughput=1.0, first=0.1,
                                 pss=1e6)],
                   case_rows("out_of_core", "ooc:memmap/k5", {"epoch1.samples_per_s": [1.0]},
                             format="memmap", encoding="raw", loader="lazy",
                             access="shuffle", cache="cold"),
                   build_case("memmap", seconds=0.5, apparent=1_000_000, files=2))
    with_ooc = report.ram_findings(beyond, env)
    assert with_ooc[-1].startswith("Every warm case of the in-memory studies fits in the page "
                                   "cache; the out_of_core study's rows")
    assert not any("do not show" in sentence for sentence in with_ooc)
