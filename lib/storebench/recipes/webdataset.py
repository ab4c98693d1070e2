"""WebDataset's own pipeline over tar shards, as its README builds it: shards split between
DataLoader workers and shuffled, a 1,000-sample buffer, decode and batch in the workers."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="webdataset",
    layout="webdataset",
    encoding="jpeg",
    reader="wds.WebDataset over tar shards, split by worker",
    decoder="simplejpeg in the DataLoader's workers, the whole image",
    transform=TransformTraits("antialiased", "whole image",
                              "storebench RandomResizedCropFlip (Pillow, bilinear, as "
                              "torchvision's RandomResizedCrop)", resampler="pillow"),
    loader="webdataset",
    parallelism="num_workers DataLoader worker processes",
    output="uint8 (B, 224, 224, 3) batch from torch's DataLoader (batch_size=None)",
    doc="https://github.com/webdataset/webdataset#readme",
    tuning=(Tuning("num_workers", "the cores", "each worker streams its own shards"),
            Tuning("shuffle", "1,000 samples", "the README's buffer, after a shard shuffle"),
            Tuning("batched", "in the workers, DataLoader batch_size=None", "the README: "
                   "workers hand over whole batches")),
)
