"""torchdata's StatefulDataLoader, the resumable drop-in for torch's DataLoader, over
storebench's LMDB reader."""

from .base import Recipe, TransformTraits, Tuning

RECIPE = Recipe(
    name="torchdata-lmdb",
    layout="lmdb",
    encoding="jpeg",
    reader="storebench's LMDB reader in each worker",
    decoder="simplejpeg in the workers, the whole image",
    transform=TransformTraits("antialiased", "whole image",
                              "storebench RandomResizedCropFlip (Pillow, bilinear, as "
                              "torchvision's RandomResizedCrop)", resampler="pillow"),
    loader="torchdata",
    parallelism="num_workers worker processes",
    output="uint8 (B, 224, 224, 3) batch in host memory",
    doc="https://docs.pytorch.org/data/",
    tuning=(Tuning("num_workers", "the cores", "as torch's DataLoader"),
            Tuning("state_dict", "taken between batches", "the reason it exists: exact "
                   "mid-epoch resume")),
    note="torchdata has no storage reader of its own: its workers call storebench's reader",
)
