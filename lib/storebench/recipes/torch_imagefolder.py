"""The common default, tuned: torch's DataLoader over one JPEG file per sample (what an
ImageFolder reads), Pillow decoding and cropping as torchvision's transforms do."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="torch-imagefolder",
    layout="rawfiles",
    encoding="jpeg",
    reader="one file per sample (an ImageFolder's layout)",
    decoder="Pillow, the whole image",
    transform=TransformTraits("antialiased", "whole image",
                              "storebench RandomResizedCropFlip (Pillow, bilinear, as "
                              "torchvision's RandomResizedCrop)", resampler="pillow"),
    loader="torch",
    decode="pil",
    parallelism="num_workers worker processes, one per core",
    output="uint8 (B, 224, 224, 3) torch tensor in host memory (pinned with pin_memory)",
    doc="https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html",
    tuning=(Tuning("num_workers", "the cores", "the tuning guide: workers load "
                   "asynchronously, beside the training loop"),
            Tuning("persistent_workers", "True", "workers are started once, not every "
                   "epoch"),
            Tuning("pin_memory", "True with a CUDA device", "page-locked batches copy to "
                   "the device faster")),
    distributions=("pillow",),
    # torchvision does not import beside this CPU build of torch: storebench's Pillow crop
    # draws torchvision's boxes.
    note="decodes and crops with Pillow as torchvision would; torchvision itself does not "
         "import beside the CPU build of torch this project pins",
    code='''import os

from storebench import open_dataset
from storebench.loaders import LazyDataset, RandomResizedCropFlip, ShuffleSampler
from storebench.loaders.torch_adapter import torch_dataloader

reader = open_dataset("{dataset}")
dataset = LazyDataset(reader, decode="pil", transform=RandomResizedCropFlip(resampler="pillow"),
                      output_shape=(224, 224, 3))
sampler = ShuffleSampler(len(dataset), seed=0)
loader = torch_dataloader(dataset, batch_size=64, sampler=sampler,
                          num_workers=os.cpu_count(), persistent_workers=True)
for epoch in range(1):
    sampler.set_epoch(epoch)
    dataset.set_epoch(epoch)  # fresh crops each epoch
    for images, labels in loader:
        pass  # your training step here
''',
)
