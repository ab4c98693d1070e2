"""tf.data's own resume: a ``tfrecord_pipeline`` iterator checkpointed with
``tf.train.Checkpoint`` and SIGKILLed, restored in a new process, delivers the rest of the
epoch byte for byte; the checkpoint holds the shuffle buffer; ``from_generator`` refuses."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

CHILD = Path(__file__).with_name("tf_resume_child.py")
ROOT_DIR = Path(__file__).resolve().parents[2]
BATCH = 24
RECORD_BYTES = 32 * 32 * 3  # a ci raw sample


def run_child(config: dict, tmp: Path, name: str) -> list[bytes] | int:
    path = tmp / f"{name}.json"
    out = tmp / f"{name}.pkl"
    path.write_text(json.dumps({**config, "out": str(out)}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT_DIR / "lib"), str(ROOT_DIR), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(CHILD), str(path)], capture_output=True,
                            text=True, timeout=240, env=env)
    expected = -9 if config["mode"] == "first" else 0
    assert result.returncode == expected, result.stderr[-3000:]
    return pickle.loads(out.read_bytes())


@pytest.mark.timeout(900)
@pytest.mark.parametrize("shuffle_buffer", [0, 256])
def test_a_killed_tf_data_epoch_resumes_from_its_iterator_checkpoint(build_ci, tmp_path,
                                                                     shuffle_buffer):
    from storebench.loaders.tf_checkpoint import checkpoint_bytes

    root = build_ci("tfrecord", "raw")
    config = {"root": str(root), "batch_size": BATCH, "shuffle_buffer": shuffle_buffer,
              "seed": 4, "batches": 5, "checkpoint": str(tmp_path / "checkpoint")}
    whole = run_child({**config, "mode": "whole"}, tmp_path, "whole")
    head = run_child({**config, "mode": "first"}, tmp_path, "first")
    tail = run_child({**config, "mode": "rest"}, tmp_path, "rest")
    assert len(head) == 5 and head + tail == whole
    if shuffle_buffer:  # the buffer's records are in the checkpoint
        assert checkpoint_bytes(tmp_path / "checkpoint") > shuffle_buffer * RECORD_BYTES


@pytest.mark.timeout(300)
def test_a_generator_pipeline_cannot_be_checkpointed(tmp_path):
    import tensorflow as tf

    dataset = tf.data.Dataset.from_generator(lambda: iter(range(10)),
                                             output_signature=tf.TensorSpec((), tf.int64))
    iterator = iter(dataset)
    next(iterator)
    with pytest.raises(tf.errors.FailedPreconditionError, match="PyFunc is stateful"):
        tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "iterator"))
