"""MosaicML Streaming's StreamingDataset over MDS shards in its StreamingDataLoader, decoding
in the workers, as its docs' "Main Concepts" show."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="mds",
    layout="mds",
    encoding="jpeg",
    reader="streaming StreamingDataset over local MDS shards",
    decoder="simplejpeg in the workers, the whole image",
    transform=TransformTraits("antialiased", "whole image",
                              "storebench RandomResizedCropFlip (Pillow, bilinear, as "
                              "torchvision's RandomResizedCrop)", resampler="pillow"),
    loader="mds",
    parallelism="num_workers StreamingDataLoader worker processes",
    output="uint8 (B, 224, 224, 3) batch, stacked with NumPy",
    doc="https://docs.mosaicml.com/projects/streaming/en/stable/",
    tuning=(Tuning("num_workers", "the cores", "workers decode"),
            Tuning("shuffle_algo", "py1e", "the docs' default shuffle"),
            Tuning("batch_size", "the same in the dataset and the loader", "the docs: the "
                   "dataset partitions by it")),
)
