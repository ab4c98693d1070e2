"""The correctness study's audit of a peer's recipe over a small probe set, in the peers
environment: its own labels name its samples and its crops are read back from their pixels,
with no hook of ours. Every peer recipe is audited by the ci study's correctness grid, whose
rows the study contract test checks."""

from __future__ import annotations

import pytest

from storebench.recipes import RECIPES
from storebench.studies.correctness import cases

pytestmark = pytest.mark.peers

SAMPLES = 48


def audit(name: str) -> dict:
    recipe = RECIPES[name]
    reason = recipe.unavailable()
    if reason:
        pytest.skip(reason)
    with cases.probe_set(recipe, SAMPLES) as root:
        found = cases.audit_recipe(recipe, str(root), SAMPLES, batch_size=8,
                                   rank_counts=(3,), worker_counts=(1, 2))
    return {metric: value for metric, (value, _) in found.items()}


@pytest.mark.timeout(300)
def test_a_peer_over_storebench_s_sampler_delivers_every_sample_once_at_3_ranks():
    metrics = audit("torchdata-lmdb")
    for setting in ("ranks3", "workers1", "workers2"):
        assert metrics[f"exactly_once.{setting}.duplicates"] == 0, setting
        assert metrics[f"exactly_once.{setting}.misses"] == 0, setting
    assert metrics["randomness.ranks3.sequence_match_max"] == 0.0
