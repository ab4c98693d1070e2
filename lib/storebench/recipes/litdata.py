"""LitData's StreamingDataset over optimized chunks, in its StreamingDataLoader, decoding in
the workers, as its README's "Stream the data during training" shows."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="litdata",
    layout="litdata",
    encoding="jpeg",
    reader="litdata StreamingDataset over local chunks",
    decoder="simplejpeg in the workers, the whole image",
    transform=TransformTraits("antialiased", "whole image",
                              "storebench RandomResizedCropFlip (Pillow, bilinear, as "
                              "torchvision's RandomResizedCrop)", resampler="pillow"),
    loader="litdata",
    parallelism="num_workers StreamingDataLoader worker processes",
    output="uint8 (B, 224, 224, 3) batch from LitData's collate",
    doc="https://github.com/Lightning-AI/litData#readme",
    tuning=(Tuning("num_workers", "the cores", "each worker reads its share of chunks"),
            Tuning("shuffle", "True, seeded", "chunk order shuffled, then samples within "
                   "chunks")),
)
