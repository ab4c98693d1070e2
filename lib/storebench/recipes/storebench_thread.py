"""storebench's ThreadPrefetcher over LMDB JPEGs: simplejpeg decodes the whole image and
storebench's C resize crops into the batch (the GIL is released in both), one thread per
core."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="storebench-thread-lmdb",
    layout="lmdb",
    encoding="jpeg",
    reader="storebench's LMDB reader (one read transaction per thread)",
    decoder="simplejpeg (libjpeg-turbo), the whole image",
    transform=TransformTraits("antialiased", "whole image",
                              "storebench RandomResizedCropFlip (its C bilinear resize)"),
    loader="thread",
    parallelism="one thread per core",
    output="uint8 (B, 224, 224, 3) NumPy batch in host memory, reused slot",
    doc="docs/loaders.md",
    tuning=(Tuning("workers", "the cores", "decode and crop release the GIL: one thread "
                   "per core keeps every core decoding"),),
    code='''import os

from storebench import open_dataset
from storebench.loaders import (BatchSampler, LazyDataset, RandomResizedCropFlip,
                                ShuffleSampler, ThreadPrefetcher)

reader = open_dataset("{dataset}")
dataset = LazyDataset(reader, decode="simplejpeg", transform=RandomResizedCropFlip(),
                      output_shape=(224, 224, 3))
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
