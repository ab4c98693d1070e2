"""FFCV's Loader over a .beton, as its ImageNet example builds it: its own random resized
crop decoder and flip, compiled with numba, threads."""

from .base import OBJECT_STORAGE, Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="ffcv",
    layout="ffcv",
    encoding="jpeg",
    reader="FFCV Loader over a memory-mapped .beton",
    decoder="FFCV's libjpeg-turbo (fast integer DCT), the whole image",
    transform=TransformTraits("antialiased", "whole image",
                              "FFCV RandomResizedCropRGBImageDecoder (OpenCV INTER_AREA), "
                              "RandomHorizontalFlip"),
    loader="ffcv",
    parallelism="num_workers threads of FFCV's compiled pipeline",
    output="uint8 (B, 224, 224, 3) NumPy batch in host memory (FFCV's reused buffers)",
    doc="https://docs.ffcv.io/making_dataloaders.html",
    tuning=(Tuning("num_workers", "the cores", "FFCV's workers are threads of one process"),
            Tuning("os_cache", "True in RAM, False larger than RAM", "the docs: the page "
                   "cache when the set fits, QUASI_RANDOM order when it does not"),
            Tuning("order", "RANDOM in RAM, QUASI_RANDOM larger than RAM", "the docs: "
                   "quasi-random reads whole pages")),
    cannot={OBJECT_STORAGE: "FFCV reads a local .beton through a memory map"},
)
