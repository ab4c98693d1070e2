"""NVIDIA DALI's CPU pipeline over one JPEG file per sample, as its ResNet-50 example
builds it: readers.file, decoders.image_random_crop (the crop window only), resize, flip."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="dali-cpu-files",
    layout="rawfiles",
    encoding="jpeg",
    reader="DALI fn.readers.file (one file per sample)",
    decoder="DALI fn.decoders.image_random_crop on the CPU (libjpeg-turbo), the crop "
            "window only",
    transform=TransformTraits("antialiased", "crop window",
                              "fn.decoders.image_random_crop, fn.resize (antialiased "
                              "linear, DALI's default), crop_mirror_normalize flip"),
    loader="dali_file",
    parallelism="num_threads threads in the training process",
    output="uint8 (B, 224, 224, 3) batch (NumPy here; a framework iterator gives tensors)",
    doc="https://docs.nvidia.com/deeplearning/dali/user-guide/docs/examples/use_cases/"
        "pytorch/resnet50/pytorch-resnet50.html",
    tuning=(Tuning("num_threads", "the cores", "DALI's CPU operators run on its thread "
                   "pool"),
            Tuning("initial_fill", "1,024", "the reader's shuffle buffer"),
            Tuning("pad_last_batch", "True", "an epoch ends on a batch boundary")),
    cannot={"object storage": "storebench runs DALI's file reader over local files only"},
)
