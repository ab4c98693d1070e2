"""tf.data over TFRecord, as TensorFlow's performance guide advises: interleaved shards,
AUTOTUNE parallelism, decode_and_crop_jpeg (only the crop window is decoded)."""

from .base import OBJECT_STORAGE, Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="tf-data-tfrecord",
    layout="tfrecord",
    encoding="jpeg",
    reader="tf.data.TFRecordDataset, shards interleaved",
    decoder="TensorFlow tf.image.decode_and_crop_jpeg, the crop window only",
    transform=TransformTraits("plain", "crop window",
                              "tf.image.sample_distorted_bounding_box, decode_and_crop_jpeg, "
                              "tf.image.resize(antialias=False), random flip"),
    loader="tf_data",
    parallelism="AUTOTUNE: tf.data sizes its own parallel calls",
    output="uint8 (B, 224, 224, 3) tf.Tensor in host memory",
    doc="https://www.tensorflow.org/guide/data_performance",
    tuning=(Tuning("num_parallel_calls", "tf.data.AUTOTUNE", "parallelize the map "
                   "transformation"),
            Tuning("prefetch", "tf.data.AUTOTUNE", "overlap the producer and the consumer"),
            Tuning("interleave", "the shards in parallel", "parallelize data extraction"),
            Tuning("shuffle buffer", "4,096 samples", "the guide: a buffer, after the "
                   "interleave")),
    cannot={OBJECT_STORAGE: "TensorFlow 2.21 has no S3 filesystem (it left with "
                            "tensorflow-io), so tf.data cannot open s3:// shards here"},
    distributions=("tensorflow-cpu",),
    code='''from storebench.loaders.tf_adapter import tfrecord_pipeline

pipeline = tfrecord_pipeline(
    "{dataset}", batch_size=64, shuffle_buffer=4096, seed=0, deterministic=False,
    resize=(224, 224), random_crop=True)
for epoch in range(1):
    for images, labels in pipeline:
        pass  # your training step here
''',
)
