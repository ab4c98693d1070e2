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

Imported sets of images of different sizes (``ImportedSpec.fixed_size`` False) go through
``tfrecord_pipeline`` with ``resize=(height, width)``: each record is decoded to RGB at the
size its record states, then resized, before batching.

For several input pipelines (``tf.distribute.Strategy.distribute_datasets_from_function``, or
one pipeline per data-parallel process), pass the ``tf.distribute.InputContext``:
``tfrecord_pipeline(root, batch_size=global_batch, input_context=ctx)`` reads only pipeline
``ctx.input_pipeline_id``'s share, with ``dataset.shard(num_input_pipelines,
input_pipeline_id)`` as TensorFlow's guide does, and batches per replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from storebench.formats.specs import fixed_size, spec_from_dict

SHARD_BY = ("auto", "file", "record")


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
    resize: Sequence[int] | None = None,
    random_crop: bool = False,
    input_context=None,
    shard_by: str = "auto",
):
    """A ``tf.data.Dataset`` over the TFRecord shards of the dataset at ``root``.

    ``shuffle_buffer=0`` reads the shards one after another, so samples come out in index
    order; a buffer > 0 interleaves the shards in parallel, shuffles samples through the
    buffer and, unless ``shuffle_shards=False``, also shuffles the shard order.
    ``decode=False`` yields the encoded image bytes for PNG/JPEG sets. ``cache=True`` keeps
    the records in RAM after the first epoch.

    ``resize=(height, width)`` resizes every decoded image to that size (``tf.image.resize``,
    bilinear without antialiasing, rounded to uint8); it is required for a set of images of
    different sizes, which cannot be batched otherwise. Those records are decoded one by
    one to RGB whatever the file (JPEG with libjpeg's accurate integer IDCT, as the
    fixed-size path; PNG and anything else through ``tf.io.decode_image``), and each
    decoded shape is checked against the height and width its record states.
    TensorFlow's bilinear resize is not Pillow's (which antialiases when shrinking), so these
    pixels differ from a ``Resize`` transform's on the other paths.

    ``random_crop=True`` (with ``resize``) is TensorFlow's own standard training crop, as
    its reference ImageNet input pipelines write it: ``sample_distorted_bounding_box``
    (area 0.08-1, aspect ratio 3/4-4/3, ten tries, else the whole image), the JPEG decoded
    inside that window only (``decode_and_crop_jpeg``), resized, then a random horizontal
    flip. The crops are TensorFlow's draws, not ``RandomResizedCropFlip``'s: the same work,
    other pixels.

    ``input_context`` (a ``tf.distribute.InputContext``) makes this one of
    ``num_input_pipelines`` pipelines that together read every sample exactly once per epoch:
    this one reads share ``input_pipeline_id``, and ``batch_size`` is then the *global* batch
    size, of which each batch holds ``input_context.get_per_replica_batch_size(batch_size)``
    (TensorFlow's convention; a ValueError unless it divides by ``num_replicas_in_sync``).
    ``shard_by`` says how the shares are cut, as ``tf.data``'s auto-sharding policies do:

    - ``"file"``: ``shard`` the list of TFRecord files (pipeline ``i`` reads files ``i``,
      ``i + k``, ...), before their order is shuffled. Each pipeline reads only its own
      files; shares are whole files, so they differ in size when the file count is not a
      multiple of the pipeline count; needs at least as many files as pipelines;
    - ``"record"``: ``shard`` the records (pipeline ``i`` keeps records ``i``, ``i + k``, ...
      of the common order, before ``cache`` and the shuffle buffer): shares differ by at most
      one sample, but every pipeline reads every file. With ``shuffle_buffer > 0`` it needs
      ``deterministic=True``, so that all pipelines interleave the files into one record
      order (with the same ``seed``);
    - ``"auto"`` (the default): ``"file"`` when there are at least as many files as
      pipelines, else ``"record"``.
    """
    import tensorflow as tf

    from storebench.formats import read_manifest
    from storebench.formats.tfrecord import shard_paths

    root = Path(root)
    manifest = read_manifest(root)
    if manifest["format"] != "tfrecord":
        raise ValueError(f"{root}: is a {manifest['format']!r} dataset, not tfrecord")
    spec = spec_from_dict(manifest["spec"])
    variable_size = not fixed_size(spec)
    if random_crop and (resize is None or spec.encoding == "raw" or not decode):
        raise ValueError(f"{root}: random_crop=True crops encoded images as it decodes them, "
                         "then resizes: it needs JPEG or PNG records, decode=True and "
                         "resize=(height, width)")
    if resize is not None:
        resize = tuple(int(n) for n in resize)
        if len(resize) != 2 or min(resize) <= 0:
            raise ValueError(f"resize must be (height, width) of positive sizes, got {resize}")
        if spec.encoding != "raw" and not decode:
            raise ValueError("resize= works on decoded images: it needs decode=True")
    elif variable_size and decode:
        raise ValueError(
            f"{root}: the images of this dataset differ in size, so tf.data cannot batch them "
            "as decoded: pass resize=(height, width) (or decode=False for the encoded bytes)"
        )
    autotune = tf.data.AUTOTUNE
    paths = [str(p) for p in shard_paths(root)]
    shuffle_shards = shuffle_buffer > 0 if shuffle_shards is None else shuffle_shards
    shard = _how_to_shard(input_context, shard_by, num_files=len(paths), root=root)
    if shard == "record" and shuffle_buffer > 0 and not deterministic:
        raise ValueError(
            "shard_by='record' with a shuffle buffer needs deterministic=True: every pipeline "
            "must interleave the files into the same record order for their shares to "
            "partition the dataset"
        )
    if input_context is not None:
        batch_size = input_context.get_per_replica_batch_size(batch_size)

    records = _records(paths, shard=shard, input_context=input_context,
                       shuffle_shards=shuffle_shards, shuffle_buffer=shuffle_buffer, seed=seed,
                       cache=cache, deterministic=deterministic, cycle_length=cycle_length)
    parse_batch = _batch_parser(spec, root=root, resize=resize, decode=decode,
                                random_crop=random_crop)
    batched = records.batch(batch_size, drop_remainder=drop_remainder)
    if random_crop:
        # A seed pair per batch, drawn anew each epoch (each iterator), for stateless crops;
        # each input pipeline (rank) draws its own stream.
        pipeline = input_context.input_pipeline_id if input_context is not None else 0
        seeds = tf.data.Dataset.random(seed=seed * 1_000_003 + pipeline,
                                       rerandomize_each_iteration=True).batch(2)
        batched = tf.data.Dataset.zip((batched, seeds))
    return batched.map(
        parse_batch, num_parallel_calls=autotune, deterministic=deterministic
    ).prefetch(autotune)


def _how_to_shard(input_context, shard_by: str, *, num_files: int, root: Path) -> str | None:
    """"file" or "record" (``shard_by`` with "auto" resolved), or None when there is no
    input context or only one pipeline, which reads everything."""
    if shard_by not in SHARD_BY:
        raise ValueError(f"shard_by must be one of {SHARD_BY}, got {shard_by!r}")
    if input_context is None:
        return None
    pipelines = input_context.num_input_pipelines
    if pipelines == 1:
        return None
    if shard_by == "auto":
        return "file" if num_files >= pipelines else "record"
    if shard_by == "file" and num_files < pipelines:
        raise ValueError(
            f"{root}: shard_by='file' needs at least one TFRecord file per input pipeline, "
            f"and there are {num_files} files for {pipelines} pipelines: use "
            "shard_by='record', or build the dataset with more shards (num_shards)"
        )
    return shard_by


def gil_bound_generator_dataset(dataset, batches):
    """GIL-BOUND: ``tf.data.Dataset.from_generator`` over ``dataset.get_batch`` for each
    index array in ``batches`` (a ``BatchSampler``). Works for every format; runs the
    reading and decoding in Python under the GIL. Samples must be fixed-size arrays."""
    import tensorflow as tf

    shape = dataset.sample_shape
    if shape is None:
        raise ValueError(
            "gil_bound_generator_dataset needs fixed-size array samples: pass decode= to the "
            "dataset, and for images of different sizes a transform with a fixed output "
            "(storebench.loaders.Resize), or output_shape= with another transform"
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


def _training_crop(tf, *, resize: tuple[int, int], channels: int):
    """``crop(data, height, width, channels, seed) -> image``: TensorFlow's standard training
    crop of one encoded record (see ``tfrecord_pipeline``'s ``random_crop``), drawn by
    stateless ops from the record's own ``seed`` (shape [2]): a stateful op's seed would
    restart with every new iterator, and every epoch would draw the same crops."""
    whole = tf.constant([[[0.0, 0.0, 1.0, 1.0]]])

    def crop(data, height, width, stored_channels, seed):
        box_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.cast(tf.stack([height, width, stored_channels]), tf.int32),
            bounding_boxes=whole, seed=box_seed,
            min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        is_jpeg = tf.equal(tf.strings.substr(data, 0, 3), b"\xff\xd8\xff")
        image = tf.cond(
            is_jpeg,
            lambda: tf.image.decode_and_crop_jpeg(data, tf.cast(window, tf.int32),
                                                  channels=channels,
                                                  dct_method="INTEGER_ACCURATE"),
            lambda: tf.slice(
                tf.io.decode_image(data, channels=channels, expand_animations=False),
                tf.stack([begin[0], begin[1], 0]), tf.stack([size[0], size[1], channels])))
        scaled = tf.image.resize(image[None], resize, method="bilinear", antialias=False)[0]
        image = tf.cast(tf.clip_by_value(tf.round(scaled), 0, 255), tf.uint8)
        return tf.image.stateless_random_flip_left_right(image, seed=flip_seed)

    return crop


def _batch_parser(spec, *, root: Path, resize: tuple[int, int] | None, decode: bool,
                  random_crop: bool = False):
    """``parse_batch(serialized[, batch_seed]) -> (images, labels)`` for a batch of
    ``spec``'s records (``batch_seed``, shape [2], with ``random_crop``):
    raw pixels reshaped, encoded images decoded (or kept, without ``decode``), each checked
    against its stated shape and resized to ``resize`` where given (after TensorFlow's
    training crop, with ``random_crop``)."""
    import tensorflow as tf

    from storebench.formats.tfrecord import tf_feature_spec

    variable_size = not fixed_size(spec)
    features = tf_feature_spec()
    shape = spec.image_shape if not variable_size else None
    out_shape = (*resize, spec.channels) if resize is not None else shape

    def resized(images):
        """uint8 images resized to ``resize``, rounded as a uint8 pipeline would round."""
        if resize is None:
            return images
        scaled = tf.image.resize(images, resize, method="bilinear", antialias=False)
        return tf.cast(tf.clip_by_value(tf.round(scaled), 0, 255), tf.uint8)

    def decode_jpeg(data, channels):
        # The accurate integer IDCT is libjpeg's default, and so PIL's and simplejpeg's:
        # with it every path decodes to the same pixels (TF's default is the fast one).
        return tf.io.decode_jpeg(data, channels=channels, dct_method="INTEGER_ACCURATE")

    def decode_any(data, channels):
        """JPEG or PNG, told apart by the first bytes, as "mixed" sets need."""
        is_jpeg = tf.equal(tf.strings.substr(data, 0, 3), b"\xff\xd8\xff")
        return tf.cond(
            is_jpeg,
            lambda: decode_jpeg(data, channels),
            lambda: tf.io.decode_image(data, channels=channels, expand_animations=False),
        )

    def decode_variable(record):
        data, height, width, channels = record
        image = decode_any(data, spec.channels)
        check = tf.debugging.assert_equal(
            tf.shape(image, out_type=tf.int64),
            tf.stack([height, width, channels]),
            message=f"{root}: a record decoded to another shape than the one it states",
        )
        with tf.control_dependencies([check]):
            return resized(tf.ensure_shape(image, (None, None, spec.channels)))

    crop = (_training_crop(tf, resize=resize, channels=spec.channels)
            if random_crop else None)

    def parse_batch(serialized, batch_seed=None):
        wanted = ["image", "label"] + (["height", "width", "channels"] if variable_size else [])
        parsed = tf.io.parse_example(serialized, {name: features[name] for name in wanted})
        if spec.encoding == "raw":
            pixels = tf.io.decode_raw(parsed["image"], tf.uint8)
            return resized(tf.reshape(pixels, (-1, *shape))), parsed["label"]
        if not decode:
            return parsed["image"], parsed["label"]
        if random_crop:
            sizes = ((parsed["height"], parsed["width"], parsed["channels"]) if variable_size
                     else tuple(tf.fill(tf.shape(parsed["label"]), tf.constant(n, tf.int64))
                                for n in spec.image_shape))
            # One seed per record, split from the batch's (fresh every epoch).
            seeds = tf.random.experimental.stateless_split(
                batch_seed, tf.shape(parsed["label"])[0])
            images = tf.map_fn(
                lambda record: crop(*record), (parsed["image"], *sizes, seeds),
                fn_output_signature=tf.TensorSpec(out_shape, tf.uint8),
            )
            return images, parsed["label"]
        if variable_size:
            images = tf.map_fn(
                decode_variable,
                (parsed["image"], parsed["height"], parsed["width"], parsed["channels"]),
                fn_output_signature=tf.TensorSpec(out_shape, tf.uint8),
            )
            return images, parsed["label"]
        decoder = {"jpeg": decode_jpeg, "png": tf.io.decode_png}.get(spec.encoding, decode_any)
        images = tf.map_fn(
            lambda data: resized(tf.ensure_shape(decoder(data, channels=spec.channels), shape)),
            parsed["image"],
            fn_output_signature=tf.TensorSpec(out_shape, tf.uint8),
        )
        return images, parsed["label"]

    return parse_batch


def _records(paths: list[str], *, shard: str | None, input_context, shuffle_shards: bool,
             shuffle_buffer: int, seed: int, cache: bool, deterministic: bool,
             cycle_length: int | None):
    """The records of the TFRecord files ``paths``, this pipeline's share (``shard``), in
    index order or shuffled (see ``tfrecord_pipeline``)."""
    import tensorflow as tf

    files = tf.data.Dataset.from_tensor_slices(paths)
    if shard == "file":  # before the shuffle: every pipeline keeps the same files each epoch
        files = files.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
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
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=deterministic,
        )
    if shard == "record":
        records = records.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if cache:
        records = records.cache()
    if shuffle_buffer > 0:
        records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)

    return records
