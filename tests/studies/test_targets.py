"""The targets as data: each target's measure function times every path it compares, over
the real ci datasets, and returns what it delivered (no timings asserted)."""

from __future__ import annotations

import pytest

from storebench.bench.runner import Case
from storebench.cases.targets import TARGETS, get_target, target_ratio
from storebench.formats import open_dataset


def _case(dataset, target, **fields) -> Case:
    return Case(study="targets", function="storebench.studies.targets:target_case",
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
