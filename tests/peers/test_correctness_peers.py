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


def available(name: str):
    """The recipe ``name``, or a skip saying why it cannot run here."""
    recipe = RECIPES[name]
    reason = recipe.unavailable()
    if reason:
        pytest.skip(reason)
    return recipe


def audit(name: str) -> dict:
    recipe = available(name)
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


def ranks_epoch(name: str, world_size: int) -> tuple[dict, list[int]]:
    recipe = available(name)
    with cases.probe_set(recipe, SAMPLES) as root:
        shares = cases.run_ranks_epoch(recipe, str(root), world_size, batch_size=8,
                                       workers=1)
    metrics = cases.rank_metrics(world_size, shares, SAMPLES)
    return ({m.split(".")[-1]: value for m, (value, _) in metrics.items()},
            [len(share.labels) for share in shares])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["webdataset", "dali-cpu-files", "litdata", "mds"])
def test_a_peer_s_own_rank_split_delivers_every_sample_once_with_ranks_drawing_apart(name):
    # 48 samples over 3 ranks: each library's own split, each rank told its rank the way
    # torchrun tells it. Exact, and no two ranks draw one crop sequence.
    metrics, per_rank = ranks_epoch(name, 3)
    assert metrics["duplicates"] == 0 and metrics["misses"] == 0 and metrics["unknown"] == 0
    assert metrics["tag_mismatches"] == 0
    assert sum(per_rank) - metrics["padding"] == SAMPLES and all(per_rank)
    assert metrics["sequence_match_max"] == 0.0


@pytest.mark.timeout(120)
def test_a_peer_told_another_rank_than_its_library_sees_refuses_to_read():
    from storebench.formats import DatasetError
    from storebench.loaders.paths import PathOptions
    from storebench.loaders.peers import check_rank

    options = PathOptions(batch_size=8, rank=1, world_size=3)
    with pytest.raises(DatasetError, match=r"^/x: WebDataset sees rank 0 of 1 \(from the "
                                           r"environment or torch.distributed\), but this "
                                           r"run is rank 1 of 3"):
        check_rank("/x", "WebDataset", (0, 1), options)
    check_rank("/x", "WebDataset", (1, 3), options)
