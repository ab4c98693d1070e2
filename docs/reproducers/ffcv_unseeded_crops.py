"""FFCV's random resized crop given a seed: do two runs of one seed crop alike?

The pipeline is the one FFCV's ImageNet example uses and storebench's FFCV recipe runs:
``Loader(path, batch_size=64, num_workers=2, order=OrderOption.RANDOM, seed=...)`` with
``RandomResizedCropRGBImageDecoder`` and ``RandomHorizontalFlip`` on the image. The stored
images are noise (a crop's pixels tell its box), written by FFCV's ``DatasetWriter``.
``seed`` orders the samples; the question is whether it also fixes the crops.

Run it with FFCV installed::

    python ffcv_unseeded_crops.py [--samples 512] [--workers 2]

It reads one epoch twice with the same seed and prints the share of the order and of the
crops that are alike. It exits 1 when the order repeats but the crops do not (crops are not
functions of the seed), 0 when both repeat.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from ffcv.fields import IntField, RGBImageField
from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from ffcv.loader import Loader, OrderOption
from ffcv.transforms import RandomHorizontalFlip
from ffcv.writer import DatasetWriter

SIDE = 64
CROP = 32


class NoiseImages:
    """``samples`` images of seeded noise, each labelled with its index."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int):
        pixels = np.random.default_rng(index).integers(0, 256, (SIDE, SIDE, 3), np.uint8)
        return pixels, index


def write_beton(path: Path, samples: int) -> None:
    writer = DatasetWriter(str(path), {"image": RGBImageField(write_mode="raw"),
                                       "label": IntField()}, num_workers=1)
    writer.from_indexed_dataset(NoiseImages(samples))


def one_epoch(path: Path, workers: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    loader = Loader(str(path), batch_size=64, num_workers=workers, order=OrderOption.RANDOM,
                    seed=seed, drop_last=False,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder((CROP, CROP)),
                                         RandomHorizontalFlip()],
                               "label": [IntDecoder()]})
    images, labels = [], []
    for batch_images, batch_labels in loader:
        images.append(np.array(batch_images))
        labels.append(np.array(batch_labels).reshape(-1))
    return np.concatenate(images), np.concatenate(labels)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "noise.beton"
        write_beton(path, args.samples)
        first_images, first_labels = one_epoch(path, args.workers, args.seed)
        second_images, second_labels = one_epoch(path, args.workers, args.seed)
    same_order = float(np.mean(first_labels == second_labels))
    # Crops compared sample by sample, whatever position each was delivered at.
    first = first_images[np.argsort(first_labels)]
    second = second_images[np.argsort(second_labels)]
    same_crops = float(np.mean([np.array_equal(a, b) for a, b in zip(first, second)]))
    print(f"FFCV Loader, seed={args.seed}, {args.samples} samples, {args.workers} workers, "
          f"RandomResizedCropRGBImageDecoder + RandomHorizontalFlip, one epoch read twice")
    print(f"order alike: {same_order:.0%}; crops alike: {same_crops:.0%}")
    if same_order == 1.0 and same_crops < 1.0:
        print("REPRODUCED: the seed repeats the order but not the crops")
        return 1
    print("NOT REPRODUCED: " + ("order and crops both repeat" if same_crops == 1.0 else
                                "the order does not repeat either"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
