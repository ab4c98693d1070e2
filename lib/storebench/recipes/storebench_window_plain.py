"""storebench's crop-window recipe (``storebench_window``) with the plain bilinear filter,
two pixels a direction as tf.image.resize(antialias=False) samples: the recipe to set
beside tf.data, whose filter it is."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="storebench-window-plain-lmdb",
    layout="lmdb",
    encoding="jpeg",
    reader="storebench's LMDB reader (one read transaction per thread)",
    decoder="libjpeg-turbo (the system's), the crop window only",
    transform=TransformTraits("plain", "crop window",
                              "storebench RandomResizedCropFlip(filter='plain'), "
                              "decode='window' (its C plain bilinear resize into the batch)"),
    loader="thread",
    decode="window",
    parallelism="one thread per core",
    output="uint8 (B, 224, 224, 3) NumPy batch in host memory, reused slot",
    doc="docs/loaders.md",
    tuning=(Tuning("workers", "the cores", "decode and resize run without the GIL: one "
                   "thread per core keeps every core decoding"),
            Tuning("decode", "'window'", "decode only the crop's rows and columns: the same "
                   "pixels as a whole decode")),
    code='''import os

from storebench import open_dataset
from storebench.loaders import (BatchSampler, LazyDataset, RandomResizedCropFlip,
                                ShuffleSampler, ThreadPrefetcher)

reader = open_dataset("{dataset}")
dataset = LazyDataset(reader, decode="window", output_shape=(224, 224, 3),
                      transform=RandomResizedCropFlip(filter="plain"))
sampler = ShuffleSampler(len(dataset), seed=0)
for epoch in range(1):
    sampler.set_epoch(epoch)
    dataset.set_epoch(epoch)  # fresh crops each epoch
    with ThreadPrefetcher(dataset, BatchSampler(sampler, 64),
                          workers=os.cpu_count()) as batches:
        for batch in batches:
            images, labels = batch.images, batch.labels  # your training step here
''',
)
