"""WebDataset's README shuffle on a small set: is the delivered order a shuffle?

The pipeline is the one WebDataset's README builds and storebench's WebDataset recipe runs:
``wds.WebDataset(urls, shardshuffle=len(urls), seed=...)``, ``.shuffle(1000, seed=...)``,
batched in the pipeline, read through a torch ``DataLoader`` with 2 workers (each worker
gets its own shards). Every sample carries its stored index, so the delivered order can be
compared with the stored one.

Run it with WebDataset and PyTorch installed::

    python webdataset_shuffle.py [--samples 2048] [--per-shard 500] [--workers 2]

For each of ``--seeds`` seeds it prints Spearman's correlation between delivered and stored
order and the longest run of consecutive stored samples. It exits 1 when the order of any
seed is not a shuffle by storebench's rule (|correlation| above max(0.1, 3/sqrt(n)), or a
run longer than 8: a full permutation of 2,048 samples strays by 0.022 at one standard
deviation), 0 when every seed's is.
"""

import argparse
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import webdataset as wds


def write_shards(folder: Path, samples: int, per_shard: int) -> list[str]:
    with wds.ShardWriter(str(folder / "shard-%06d.tar"), maxcount=per_shard,
                         verbose=0) as sink:
        for index in range(samples):
            sink.write({"__key__": f"{index:06d}", "cls": index})
    return sorted(str(path) for path in folder.glob("shard-*.tar"))


def delivered_order(urls: list[str], workers: int, seed: int) -> np.ndarray:
    dataset = (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed)
               .shuffle(1000, seed=seed).decode().to_tuple("cls").batched(64))
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    return np.concatenate([np.asarray(labels) for (labels,) in loader])


def longest_stored_run(order: np.ndarray) -> int:
    longest = run = 1
    for before, after in zip(order[:-1], order[1:]):
        run = run + 1 if after == before + 1 else 1
        longest = max(longest, run)
    return longest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--per-shard", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        urls = write_shards(Path(scratch), args.samples, args.per_shard)
        orders = [delivered_order(urls, args.workers, seed) for seed in range(args.seeds)]
    print(f"webdataset {wds.__version__}: {args.samples} samples in {len(urls)} shards, "
          f"shardshuffle={len(urls)}, .shuffle(1000), {args.workers} DataLoader workers")
    limit = max(0.1, 3 / math.sqrt(args.samples))
    failed = 0
    for seed, order in enumerate(orders):
        assert sorted(order.tolist()) == list(range(args.samples)), "not every sample once"
        # Spearman's correlation of a permutation: the Pearson one of (position, index).
        correlation = float(np.corrcoef(np.arange(len(order)), order)[0, 1])
        run = longest_stored_run(order)
        shuffled = abs(correlation) <= limit and run <= 8
        failed += not shuffled
        print(f"seed {seed}: rank correlation with the stored order {correlation:+.3f}, "
              f"longest stored run {run}{'' if shuffled else '  <- not a shuffle'}")
    print(f"a shuffle: correlation within +/-{limit:.3f}, longest stored run at most 8")
    if failed:
        print(f"REPRODUCED: {failed} of {len(orders)} seeds' orders are not a shuffle")
        return 1
    print("NOT REPRODUCED: every seed's order is a shuffle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
