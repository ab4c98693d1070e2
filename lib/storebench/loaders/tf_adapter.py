"""tf.data paths: the native TFRecord pipeline, and ``from_generator`` over any Reader.

- ``tfrecord_pipeline``: what TensorFlow's input-pipeline guide recommends for TFRecord
  shards — shuffle the shard list, ``interleave`` the shards in parallel, ``cache``,
  ``shuffle``, ``batch``, parse (and decode) in parallel with ``map``, ``prefetch``, all
  tuned with ``AUTOTUNE``. Parsing and decoding run in TensorFlow's C++ thread pool.
- ``gil_bound_generator_dataset``: ``tf.data.Dataset.from_generator`` over one of our
  datasets. The generator is Python called under the GIL from TensorFlow's threads, so
  this path cannot run in parallel whatever ``num_parallel_calls`` says: it is GIL-bound
  and is here as the way other formats can reach tf.data, not as a fast path.

Both yield ``(images, labels)``: uint8 (B, H, W, C) and int64 (B,) tensors. Importing this
module does not import TensorFlow; the functions do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data_gen import DatasetSpec


def tfrecord_pipeline(
    root: Path | str,
    *,
    batch_size: int,
    shuffle_buffer: int = 0,
    shuffle_shards: bool | None = None,
    seed: int = 0,
    cache: bool = False,
    decode: bool = True,
    drop_remainder: bool = False,
    deterministic: bool = True,
    cycle_length: int | None = None,
):
    """A ``tf.data.Dataset`` over the TFRecord shards of the dataset at ``root``.

    ``shuffle_buffer=0`` reads the shards one after another, so samples come out in index
    order; a buffer > 0 interleaves the shards in parallel, shuffles samples through the
    buffer and, unless ``shuffle_shards=False``, also shuffles the shard order.
    ``decode=False`` yields the encoded image bytes for PNG/JPEG sets. ``cache=True`` keeps
    the records in RAM after the first epoch.
    """
    import tensorflow as tf

    from storebench.formats import read_manifest
    from storebench.formats.tfrecord import shard_paths, tf_feature_spec

    root = Path(root)
    manifest = read_manifest(root)
    if manifest["format"] != "tfrecord":
        raise ValueError(f"{root}: is a {manifest['format']!r} dataset, not tfrecord")
    spec = DatasetSpec.from_dict(manifest["spec"])
    autotune = tf.data.AUTOTUNE
    paths = [str(p) for p in shard_paths(root)]
    shuffle_shards = shuffle_buffer > 0 if shuffle_shards is None else shuffle_shards

    files = tf.data.Dataset.from_tensor_slices(paths)
    if shuffle_shards:
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)

    def read_shard(path):
        return tf.data.TFRecordDataset(path, buffer_size=8 << 20)

    if shuffle_buffer == 0:
        records = files.flat_map(read_shard)  # one shard after another: index order
    else:
        records = files.interleave(
            read_shard,
            cycle_length=cycle_length if cycle_length is not None else min(len(paths), 8),
            num_parallel_calls=autotune,
            deterministic=deterministic,
        )
    if cache:
        records = records.cache()
    if shuffle_buffer > 0:
        records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)

    features = tf_feature_spec()
    shape = spec.image_shape

    def parse_batch(serialized):
        parsed = tf.io.parse_example(
            serialized, {"image": features["image"], "label": features["label"]}
        )
        if spec.encoding == "raw":
            pixels = tf.io.decode_raw(parsed["image"], tf.uint8)
            return tf.reshape(pixels, (-1, *shape)), parsed["label"]
        if not decode:
            return parsed["image"], parsed["label"]
        if spec.encoding == "jpeg":
            # The accurate integer IDCT is libjpeg's default, and so PIL's and simplejpeg's:
            # with it every path decodes to the same pixels (TF's default is the fast one).
            def decoder(data, channels):
                return tf.io.decode_jpeg(data, channels=channels, dct_method="INTEGER_ACCURATE")
        else:
            decoder = tf.io.decode_png
        images = tf.map_fn(
            lambda data: tf.ensure_shape(decoder(data, channels=spec.channels), shape),
            parsed["image"],
            fn_output_signature=tf.TensorSpec(shape, tf.uint8),
        )
        return images, parsed["label"]

    batched = records.batch(batch_size, drop_remainder=drop_remainder)
    return batched.map(
        parse_batch, num_parallel_calls=autotune, deterministic=deterministic
    ).prefetch(autotune)


def gil_bound_generator_dataset(dataset, batches):
    """GIL-BOUND: ``tf.data.Dataset.from_generator`` over ``dataset.get_batch`` for each
    index array in ``batches`` (a ``BatchSampler``). Works for every format; runs the
    reading and decoding in Python under the GIL. Samples must be fixed-size arrays."""
    import tensorflow as tf

    shape = dataset.sample_shape
    if shape is None:
        raise ValueError(
            "gil_bound_generator_dataset needs fixed-size array samples: pass decode= to the "
            "dataset (or output_shape= with a transform)"
        )
    dtype = tf.as_dtype(np.dtype(dataset.sample_dtype))

    def generate():
        for indices in batches:
            batch = dataset.get_batch(indices)
            yield batch.images, batch.labels

    return tf.data.Dataset.from_generator(
        generate,
        output_signature=(
            tf.TensorSpec((None, *shape), dtype),
            tf.TensorSpec((None,), tf.int64),
        ),
    )
