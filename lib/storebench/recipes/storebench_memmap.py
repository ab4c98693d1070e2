"""storebench's ThreadPrefetcher over pre-decoded raw arrays in a memory-mapped .npy: no
decode, only the crop, one thread per core."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="storebench-thread-memmap",
    layout="memmap",
    encoding="raw",
    reader="storebench's memmap reader (NumPy take from the mapped array)",
    decoder="none: the pixels are stored decoded",
    transform=TransformTraits("antialiased", "whole image",
                              "storebench RandomResizedCropFlip (its C bilinear resize)"),
    loader="thread",
    decode=None,
    parallelism="one thread per core",
    output="uint8 (B, 224, 224, 3) NumPy batch in host memory, reused slot",
    doc="docs/loaders.md",
    tuning=(Tuning("workers", "the cores", "the crop releases the GIL: one thread per "
                   "core"),),
    code='''import os

from storebench import open_dataset
from storebench.loaders import (BatchSampler, LazyDataset, RandomResizedCropFlip,
                                ShuffleSampler, ThreadPrefetcher)

reader = open_dataset("{dataset}")
dataset = LazyDataset(reader, transform=RandomResizedCropFlip(), output_shape=(224, 224, 3))
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
