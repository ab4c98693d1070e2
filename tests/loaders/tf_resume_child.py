"""A tf.data training process for ``test_tf_resume.py``: ``tfrecord_pipeline`` batches,
checkpointed with ``tf.train.Checkpoint(iterator=...)``.

Usage: python tf_resume_child.py CONFIG.json. ``mode`` "whole" reads an epoch; "first" reads
``batches`` batches, saves a checkpoint, writes them and SIGKILLs itself; "rest" restores the
latest checkpoint and reads the rest of the epoch."""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
from pathlib import Path


def main(config: dict) -> None:
    import tensorflow as tf

    from storebench.loaders.tf_adapter import tfrecord_pipeline

    dataset = tfrecord_pipeline(config["root"], batch_size=config["batch_size"],
                                shuffle_buffer=config["shuffle_buffer"], seed=config["seed"])
    iterator = iter(dataset)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    out = Path(config["out"])
    if config["mode"] == "rest":
        checkpoint.restore(tf.train.latest_checkpoint(config["checkpoint"])).assert_consumed()
    delivered = []
    for images, labels in iterator:
        delivered.append(images.numpy().tobytes() + labels.numpy().tobytes())
        if config["mode"] == "first" and len(delivered) == config["batches"]:
            checkpoint.save(os.path.join(config["checkpoint"], "iterator"))
            out.write_bytes(pickle.dumps(delivered))
            os.kill(os.getpid(), signal.SIGKILL)
    out.write_bytes(pickle.dumps(delivered))


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
