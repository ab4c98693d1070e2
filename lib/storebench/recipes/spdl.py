"""SPDL's pipeline (thread stages on one event loop) reading through storebench's LMDB
reader and decoding with simplejpeg, as its "Getting started" and ImageNet example build
it."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="spdl-lmdb",
    layout="lmdb",
    encoding="jpeg",
    reader="storebench's LMDB reader, in an SPDL thread stage",
    decoder="simplejpeg in an SPDL thread stage, the whole image",
    transform=TransformTraits("antialiased", "whole image",
                              "storebench RandomResizedCropFlip (Pillow, bilinear, as "
                              "torchvision's RandomResizedCrop)", resampler="pillow"),
    loader="spdl",
    parallelism="concurrency tasks per stage on a pool of threads",
    output="uint8 (B, 224, 224, 3) NumPy batch in host memory",
    doc="https://facebookresearch.github.io/spdl/",
    tuning=(Tuning("concurrency", "the cores", "GIL-releasing stages run in threads"),
            Tuning("output_order", "input", "batches leave in the sampler's order")),
    note="SPDL has no storage reader of its own: its stages call storebench's reader",
)
