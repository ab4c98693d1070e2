"""LitData's shuffle on a small set: is the delivered order a shuffle?

The pipeline is the one LitData's README recommends and storebench's LitData recipe runs:
samples written into chunks (``chunk_bytes`` 8 MiB), read by
``StreamingDataset(input_dir, shuffle=True, seed=..., drop_last=False)`` through
``StreamingDataLoader(batch_size=64, num_workers=2)``. Each sample is its stored index and
a payload of the audit's probe size (6,729 bytes), so the chunks cut the set as they cut
the audit's probe set.

Run it with LitData and PyTorch installed::

    python litdata_shuffle.py [--samples 2048] [--item-bytes 6729] [--workers 2]

For each of ``--seeds`` seeds it prints Spearman's correlation between delivered and stored
order and the longest run of consecutive stored samples. It exits 1 when the order of any
seed is not a shuffle by storebench's rule (|correlation| above max(0.1, 3/sqrt(n)), or a
run longer than 8: a full permutation of 2,048 samples strays by 0.022 at one standard
deviation), 0 when every seed's is.
"""

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import litdata
import numpy as np
from litdata.streaming.writer import BinaryWriter

CHUNK_BYTES = 8 << 20


def write_chunks(folder: Path, samples: int, item_bytes: int) -> int:
    """The samples in LitData's chunks (its writer, one process); returns the chunk count."""
    writer = BinaryWriter(str(folder), chunk_bytes=CHUNK_BYTES)
    for index in range(samples):
        writer.add_item(index, {"index": index, "payload": bytes(item_bytes)})
    writer.done()
    writer._merge_no_wait()  # merge() also waits for other writers; there are none here
    return len(json.loads((folder / "index.json").read_text())["chunks"])


def delivered_order(folder: Path, cache: Path, workers: int, seed: int) -> np.ndarray:
    dataset = litdata.StreamingDataset(str(folder), cache_dir=str(cache), shuffle=True,
                                       seed=seed, drop_last=False)
    loader = litdata.StreamingDataLoader(dataset, batch_size=64, num_workers=workers)
    return np.concatenate([np.asarray(batch["index"]) for batch in loader])


def longest_stored_run(order: np.ndarray) -> int:
    longest = run = 1
    for before, after in zip(order[:-1], order[1:]):
        run = run + 1 if after == before + 1 else 1
        longest = max(longest, run)
    return longest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--item-bytes", type=int, default=6729)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "chunks"
        chunks = write_chunks(folder, args.samples, args.item_bytes)
        orders = [delivered_order(folder, Path(scratch) / f"cache-{seed}", args.workers, seed)
                  for seed in range(args.seeds)]
    print(f"litdata {litdata.__version__}: {args.samples} samples of {args.item_bytes} bytes "
          f"in {chunks} chunks of up to {CHUNK_BYTES >> 20} MiB, shuffle=True, "
          f"{args.workers} workers")
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
