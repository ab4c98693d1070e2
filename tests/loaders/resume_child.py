"""A training process for ``test_resume.py``: one epoch through a prefetcher that saves a
checkpoint (its state and the batches delivered so far) every few batches and SIGKILLs
itself right after delivering a given batch. Started again, it resumes from the last
checkpoint, with whatever prefetcher and worker count it is given this time.

Usage: python resume_child.py CONFIG.json (keys: see ``main``)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
from pathlib import Path


def main(config: dict) -> None:
    from storebench.formats import open_dataset
    from storebench.loaders import (
        BatchSampler,
        LazyDataset,
        ProcessPrefetcher,
        ShuffleSampler,
        ThreadPrefetcher,
    )

    checkpoint = Path(config["checkpoint"])
    with open_dataset(config["root"]) as reader:
        dataset = LazyDataset(reader)
        batches = BatchSampler(ShuffleSampler(len(dataset), seed=config["seed"]),
                               config["batch_size"])
        if config["prefetcher"] == "process":
            prefetcher = ProcessPrefetcher(dataset, batches, workers=config["workers"],
                                           start_method=config["start_method"])
            Path(config["pids"]).write_text(json.dumps(
                {"pid": os.getpid(), "workers": prefetcher.pids, "shm": prefetcher.shm_name}))
        else:
            prefetcher = ThreadPrefetcher(dataset, batches, workers=config["workers"])
        delivered: list[bytes] = []
        with prefetcher:
            if checkpoint.exists():
                saved = pickle.loads(checkpoint.read_bytes())
                prefetcher.load_state_dict(saved["state"])
                delivered = saved["delivered"]
            prefetcher.set_epoch(config["epoch"])  # the state's epoch: keeps its position
            for batch in prefetcher:
                delivered.append(batch.images.tobytes() + batch.labels.tobytes()
                                 + batch.indices.tobytes())
                if len(delivered) - 1 == config["kill_after"]:
                    os.kill(os.getpid(), signal.SIGKILL)
                if len(delivered) % config["every"] == 0:
                    save(checkpoint, {"state": prefetcher.state_dict(), "delivered": delivered})
        Path(config["out"]).write_bytes(pickle.dumps(delivered))


def save(path: Path, content: dict) -> None:
    """Write, then rename: a kill mid-write leaves the previous checkpoint whole."""
    partial = path.with_suffix(".partial")
    partial.write_bytes(pickle.dumps(content))
    os.replace(partial, path)


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
