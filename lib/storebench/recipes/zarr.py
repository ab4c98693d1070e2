"""A Zarr array read by index through its Python reader: Zarr has no training loader of its
own, so its reader feeds storebench's ProcessPrefetcher."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="zarr-process",
    layout="zarr",
    encoding="jpeg",
    reader="zarr array reads by index, through storebench's reader",
    decoder="simplejpeg in the workers, the whole image",
    transform=TransformTraits("antialiased", "whole image",
                              "storebench RandomResizedCropFlip (Pillow, bilinear)"),
    loader="process",
    parallelism="one worker process per core",
    output="uint8 (B, 224, 224, 3) NumPy views of a shared-memory slot",
    doc="https://zarr.readthedocs.io/",
    tuning=(Tuning("workers", "the cores", "each worker reads whole batches"),),
    note="Zarr has no loader of its own: its reader feeds storebench's ProcessPrefetcher",
)
