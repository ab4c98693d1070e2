"""The targets as data: each target's measure function times every path it compares, over
the real ci datasets, and returns what it delivered (no timings asserted)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from storebench.bench.case import Case
from storebench.formats import open_dataset
from storebench.studies.targets.cases import TARGETS, get_target, target_ratio


def _case(dataset, target, **fields) -> Case:
    return Case(study="targets", function="storebench.studies.targets.cases:target_case",
                dataset=str(dataset), loader=target.key, workers=target.workers,
                params={"target": target.key, "max_batches": 3, **dict(target.params)},
                **fields)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("key", [t.key for t in TARGETS])
def test_each_target_measures_its_paths_and_its_ratio(key, ci_data_root):
    target = get_target(key)
    wanted = target.dataset
    fmt = wanted.required or wanted.preferred[0]
    dataset = ci_data_root / f"{fmt}-{wanted.encoding}"
    case = _case(dataset, target, batch_size=32)
    with open_dataset(dataset, verify=False) as reader:
        measured, extra = target.measure(reader, case)
    for name, m in measured.items():
        assert m.samples > 0 and m.bytes > 0, name
    values = {f"{p}.samples_per_s": m.samples_per_second for p, m in measured.items()}
    values.update({name: value for name, (value, _) in extra.items()})
    wanted = {m for m in (*target.numerator, target.denominator) if m}
    assert wanted <= set(values), (wanted, sorted(values))
    assert target_ratio(target, values) > 0


def test_unknown_target_names_the_known_ones():
    with pytest.raises(KeyError, match="targets are \\['preloaded_gather_vs_dram'"):
        get_target("nope")


def test_block_shuffle_interleaves_a_whole_epoch_with_the_random_reads(ci_data_root):
    target = get_target("block_vs_random_parquet")
    case = _case(ci_data_root / "parquet-raw", target, batch_size=32)
    case = replace(case, params={**dict(case.params), "random_samples": 30, "rounds": 4})
    with open_dataset(case.dataset, verify=False) as reader:
        measured, extra = target.measure(reader, case)
        sample_bytes = reader.spec.raw_sample_bytes
        n = len(reader)
        groups = len(reader.blocks()) - 1
    epoch, random = measured["block_shuffled_epoch"], measured["random_row_access"]
    # Every sample once, in whole batches (the last one short), and every random read.
    assert (epoch.samples, epoch.bytes, epoch.batches) == (n, n * sample_bytes, -(-n // 32))
    assert (random.samples, random.bytes) == (30, 30 * sample_bytes)
    assert extra["rounds"] == (4.0, "count")
    # Where the time goes: the epoch read each row group once, the random reads mostly
    # read row groups, and the ratio had the epoch cost only its reads is the higher.
    assert extra["rows_per_row_group"] == (n / groups, "count")
    assert extra["block_shuffled_epoch.row_group_reads"] == (float(groups), "count")
    for side in ("block_shuffled_epoch", "random_row_access"):
        assert 0 < extra[f"{side}.row_group_read_fraction"][0] < 1
    ratio = epoch.samples_per_second / random.samples_per_second
    assert extra["reads_only_ratio"][0] > ratio
    few = replace(case, params={**dict(case.params), "random_samples": 2})
    with open_dataset(case.dataset, verify=False) as reader:
        _, extra = target.measure(reader, few)
    assert extra["rounds"] == (2.0, "count")  # no round without random reads in it


@pytest.mark.timeout(120)
def test_thread_decode_times_one_thread_on_each_core_beside_the_prefetchers(ci_data_root):
    """One pinned one-thread pass per usable core, both prefetchers, the same batches for
    each; the denominator is the sum of the per-core rates, and the pin is let go."""
    import os

    target = get_target("thread_vs_serial_decode")
    case = replace(_case(ci_data_root / "lmdb-jpeg", target, batch_size=8),
                   params={"target": target.key, **dict(target.params), "rounds": 2,
                           "max_batches": 5})
    usable = os.sched_getaffinity(0)
    with open_dataset(case.dataset, verify=False) as reader:
        measured, extra = target.measure(reader, case)
    assert os.sched_getaffinity(0) == usable
    serial = [f"serial_cpu{cpu}" for cpu in sorted(usable)]
    assert sorted(measured) == sorted([*serial, "thread_prefetcher", "process_prefetcher"])
    (delivered,) = {(m.samples, m.batches) for m in measured.values()}
    # 5 batches after the warm-up over 2 rounds, each slice whole by the 2 workers: 2 each.
    assert target.workers == 2
    assert delivered == (2 * 2 * 8, 2 * 2)
    rates = [measured[name].samples_per_second for name in serial]
    best = max(measured[name].samples_per_second
               for name in ("thread_prefetcher", "process_prefetcher"))
    assert extra["best_prefetcher.fraction_of_cores"] == (best / sum(rates), "ratio")
    assert extra["serial.mean_samples_per_s"][0] == pytest.approx(sum(rates) / len(rates))


def test_interleaved_random_reads_do_not_evict_the_epochs_row_group(tmp_path, monkeypatch):
    """Row groups loaded in all: the same in one round as in four, since the random reads
    go through their own reader (sharing one, each slice after them would re-read the row
    group the epoch was in). Row groups of 24 samples: batches of 32 straddle them."""
    import data_gen
    from storebench.formats import build_dataset, parquet

    root = build_dataset(data_gen.PROFILES["ci"].spec_for("raw"), "parquet", tmp_path,
                         knobs={"row_group_size": 24}, workers=1).path

    loads = []
    real_load = parquet._load_row_group
    monkeypatch.setattr(parquet, "_load_row_group",
                        lambda f, group, rows: loads.append(group) or real_load(f, group, rows))
    target = get_target("block_vs_random_parquet")
    counts = {}
    for rounds in (1, 4):
        case = replace(_case(root, target, batch_size=32),
                       params={"target": target.key, "random_samples": 30, "rounds": rounds})
        loads.clear()
        with open_dataset(case.dataset, verify=False) as reader:
            target.measure(reader, case)
        counts[rounds] = len(loads)
    assert counts[4] == counts[1] > 0
