"""tf.data's own mid-epoch resume: ``tf.train.Checkpoint(iterator=...)`` over
``tfrecord_pipeline``, and what such a checkpoint costs.

TensorFlow saves an iterator's whole state: the position in each shard and every element
held in a buffer (the shuffle buffer, the interleave's open shards, the batches prefetched).
Restored in a new process over the same pipeline, it delivers the rest of the epoch, the same
batches bit for bit (``tests/loaders/test_tf_resume.py``), with or without a shuffle buffer.
The price is the size: the checkpoint holds the buffers' records, so it grows with
``shuffle_buffer`` (about ``shuffle_buffer`` x the record size: for ImageNet-size JPEGs of
~110 KB, a 10,000-record buffer makes each checkpoint ~1.1 GB, per input pipeline), where
storebench's own state (``storebench.loaders.samplers``) is a few numbers whatever the order.

Limits:

- the same pipeline only: the same files, batch size, shuffle buffer and seed; the state is
  TensorFlow's graph of iterator states, restorable into that graph and no other;
- no elastic resume: a checkpoint is one input pipeline's (one ``input_context``
  share); it cannot be re-partitioned over another number of pipelines;
- ``gil_bound_generator_dataset`` (``from_generator``) cannot be checkpointed at all:
  TensorFlow refuses to save a Python generator's state (``FailedPreconditionError``:
  "PyFunc is stateful").

Measure the size and the times on a quiet machine with::

    python -m storebench.loaders.tf_checkpoint data/small/tfrecord-jpeg \\
        --batch-size 256 --shuffle-buffer 0 1024 10000

Importing this module does not import TensorFlow; the functions do.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def checkpoint_bytes(directory: Path | str) -> int:
    """Bytes of every file of the checkpoints under ``directory``."""
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())


def measure_iterator_checkpoint(
    root: Path | str, *, batch_size: int, shuffle_buffer: int, after_batches: int = 5,
    seed: int = 0,
) -> dict:
    """Checkpoint a ``tfrecord_pipeline`` iterator after ``after_batches`` batches: the
    checkpoint's bytes, the seconds to save it, to restore it into a new iterator, and from
    the restore to the first resumed batch."""
    import tensorflow as tf

    from .tf_adapter import tfrecord_pipeline

    def pipeline():
        return tfrecord_pipeline(root, batch_size=batch_size, shuffle_buffer=shuffle_buffer,
                                 seed=seed)

    with tempfile.TemporaryDirectory(prefix="storebench-tf-checkpoint-") as directory:
        iterator = iter(pipeline())
        for _ in range(after_batches):
            next(iterator)
        began = time.perf_counter()
        path = tf.train.Checkpoint(iterator=iterator).save(f"{directory}/iterator")
        saved = time.perf_counter()
        size = checkpoint_bytes(directory)
        del iterator
        resumed = iter(pipeline())
        restoring = time.perf_counter()
        tf.train.Checkpoint(iterator=resumed).restore(path).assert_consumed()
        restored = time.perf_counter()
        next(resumed)
        first = time.perf_counter()
    return {"shuffle_buffer": shuffle_buffer, "checkpoint_bytes": size,
            "save_s": saved - began, "restore_s": restored - restoring,
            "restore_to_first_batch_s": first - restoring}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m storebench.loaders.tf_checkpoint",
        description="Size and time of tf.data iterator checkpoints over a TFRecord dataset.")
    parser.add_argument("root", type=Path, help="a tfrecord dataset built by storebench")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--shuffle-buffer", type=int, nargs="+", default=[0, 1024])
    parser.add_argument("--after-batches", type=int, default=5)
    args = parser.parse_args(argv)
    print("shuffle_buffer  checkpoint_MB  save_s  restore_s  restore_to_first_batch_s")
    for buffer in args.shuffle_buffer:
        row = measure_iterator_checkpoint(args.root, batch_size=args.batch_size,
                                          shuffle_buffer=buffer,
                                          after_batches=args.after_batches)
        print(f"{buffer:>14}  {row['checkpoint_bytes'] / 1e6:>13.1f}  {row['save_s']:>6.3f}  "
              f"{row['restore_s']:>9.3f}  {row['restore_to_first_batch_s']:>24.3f}")


if __name__ == "__main__":
    main()
