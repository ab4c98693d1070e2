"""storebench's ThreadPrefetcher over LMDB JPEGs with the crop-window decode: libjpeg-turbo
decodes only the rows and columns the crop keeps, and storebench's C resize writes the crop
straight into the batch, without the GIL; one thread per core."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="storebench-window-lmdb",
    layout="lmdb",
    encoding="jpeg",
    reader="storebench's LMDB reader (one read transaction per thread)",
    decoder="libjpeg-turbo (the system's), the crop window only",
    transform=TransformTraits("antialiased", "crop window",
                              "storebench RandomResizedCropFlip, decode='window' (its C "
                              "bilinear resize into the batch)"),
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
dataset = LazyDataset(reader, decode="window", transform=RandomResizedCropFlip(),
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
