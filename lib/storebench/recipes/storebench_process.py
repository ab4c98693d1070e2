"""storebench's ProcessPrefetcher over LMDB JPEGs: worker processes decode (simplejpeg),
crop (storebench's C resize) and write each batch into shared memory, one process per core."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="storebench-process-lmdb",
    layout="lmdb",
    encoding="jpeg",
    reader="storebench's LMDB reader (re-opened in each worker)",
    decoder="simplejpeg (libjpeg-turbo), the whole image",
    transform=TransformTraits("antialiased", "whole image",
                              "storebench RandomResizedCropFlip (its C bilinear resize)"),
    loader="process",
    parallelism="one worker process per core",
    output="uint8 (B, 224, 224, 3) NumPy views of a shared-memory slot, valid until the "
           "next batch",
    doc="docs/loaders.md",
    tuning=(Tuning("workers", "the cores", "each worker decodes whole batches on its own "
                   "core"),
            Tuning("start_method", "fork (spawn or forkserver where threads run)",
                   "fork starts fastest; the others are safe beside threads")),
    code='''import os

from storebench import open_dataset
from storebench.loaders import (BatchSampler, LazyDataset, ProcessPrefetcher,
                                RandomResizedCropFlip, ShuffleSampler)


def train():
    reader = open_dataset("{dataset}")
    dataset = LazyDataset(reader, decode="simplejpeg", transform=RandomResizedCropFlip(),
                          output_shape=(224, 224, 3))
    sampler = ShuffleSampler(len(dataset), seed=0)
    for epoch in range(1):
        sampler.set_epoch(epoch)
        dataset.set_epoch(epoch)  # fresh crops each epoch
        with ProcessPrefetcher(dataset, BatchSampler(sampler, 64), workers=os.cpu_count(),
                               start_method="spawn") as batches:
            for batch in batches:
                images, labels = batch.images, batch.labels  # your training step here


if __name__ == "__main__":  # spawned workers import this module again
    train()
''',
)
