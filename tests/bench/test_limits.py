"""Machine limits: every figure present, positive and finite, the cold ones really cold."""

from __future__ import annotations

import math

import pytest
from bench_support import TINY_LIMITS

from storebench.bench.limits import LIMIT_SIZES, LIMIT_UNITS, LimitSizes, measure_limits


@pytest.mark.timeout(120)
def test_limits_are_positive_finite_and_cold_was_cold(tmp_path):
    limits = measure_limits(tmp_path, sizes=TINY_LIMITS)
    for key in LIMIT_UNITS:
        assert math.isfinite(limits[key]) and limits[key] > 0, key
    assert limits["cold_random_4k_method"] in ("o_direct", "buffered_fadvise_random")
    assert limits["cold_seq_resident_fraction"] < 0.05
    assert limits["sizes"]["file_bytes"] == TINY_LIMITS.file_bytes
    assert list(tmp_path.iterdir()) == []  # the scratch file is removed


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="repeats must be positive"):
        LimitSizes(repeats=0)
    with pytest.raises(ValueError, match="distinct 4 KiB blocks"):
        LimitSizes(file_bytes=4096 * 10, random_reads=11)
    assert LIMIT_SIZES["ci"].file_bytes < LimitSizes().file_bytes
