"""A Lance table read by index through its Python reader: Lance has no training loader of its
own, so its reader feeds storebench's ProcessPrefetcher."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="lance-process",
    layout="lance",
    encoding="jpeg",
    reader="pylance LanceDataset.take (rows by index), through storebench's reader",
    decoder="simplejpeg in the workers, the whole image",
    transform=TransformTraits("antialiased", "whole image",
                              "storebench RandomResizedCropFlip (Pillow, bilinear, as "
                              "torchvision's RandomResizedCrop)", resampler="pillow"),
    loader="process",
    parallelism="one worker process per core",
    output="uint8 (B, 224, 224, 3) NumPy views of a shared-memory slot",
    doc="https://lancedb.github.io/lance/",
    tuning=(Tuning("workers", "the cores", "each worker takes whole batches of rows"),
            Tuning("start_method", "spawn", "Lance is not fork-safe: a forked reader "
                   "hangs")),
    note="Lance has no loader of its own: its reader feeds storebench's ProcessPrefetcher",
    start_method="spawn",
)
