"""What the Ray Data recipes share (``ray_data_files``, ``ray_data_parquet``,
``ray_data_webdataset``): the pipeline of Ray Data's "Data loading for ML training" guide on
a local Ray of the machine's cores, with a bounded object store, bound to loopback
(``storebench.loaders.peers.ray_data``). Each recipe module declares its own source."""

from __future__ import annotations

from ..loaders.peers.ray_data import (
    LOCAL_SHUFFLE_BUFFER,
    MAP_BATCH_ROWS,
    NO_RESUME,
    OBJECT_STORE_BYTES,
    PREFETCH_BATCHES,
)
from .base import OBJECT_STORAGE, Recipe, TransformTraits, Tuning

TRAINING_GUIDE = "https://docs.ray.io/en/latest/train/user-guides/data-loading-preprocessing.html"
PERFORMANCE_TIPS = "https://docs.ray.io/en/latest/data/performance-tips.html"
ITERATING = "https://docs.ray.io/en/latest/data/iterating-over-data.html"
SHUFFLING = "https://docs.ray.io/en/latest/data/shuffling-data.html"

TUNING = (
    Tuning("ray.init(num_cpus=...)", "the cores", "one Ray node of this machine's cores; "
           "the raylet and GCS share them (" + TRAINING_GUIDE + ")"),
    Tuning("object_store_memory", f"{OBJECT_STORE_BYTES // 2**20} MiB",
           "bounded: a pipeline ahead of its consumer backs off or spills (" +
           PERFORMANCE_TIPS + ")"),
    Tuning("map_batches(batch_size=...)", f"{MAP_BATCH_ROWS} rows, tasks of one CPU",
           "a batch a task holds in memory; stateless decode runs as tasks (" +
           PERFORMANCE_TIPS + ")"),
    Tuning("shuffle", f"files shuffled, then iter_torch_batches(local_shuffle_buffer_size="
           f"{LOCAL_SHUFFLE_BUFFER:,})", "a file shuffle and a local buffer instead of a "
           "global random_shuffle, which exchanges every row each epoch (" + SHUFFLING + ")"),
    Tuning("prefetch_batches", str(PREFETCH_BATCHES), "batches made ahead of the training "
           "step (" + ITERATING + ")"),
    Tuning("streaming_split(n, equal=False)", "one split per rank, from one driver",
           "how the guide hands each trainer its share; equal=True would drop rows "
           "(" + TRAINING_GUIDE + ")"),
)

TRANSFORM = TransformTraits("antialiased", "whole image",
                            "storebench RandomResizedCropFlip in map_batches (Pillow, "
                            "bilinear, as torchvision's RandomResizedCrop)",
                            resampler="pillow")


def ray_data_recipe(*, name: str, layout: str, loader: str, reader: str) -> Recipe:
    """A Ray Data recipe over ``layout``, read by ``reader`` (the ``ray.data.read_*`` call,
    in words), loader path ``loader``."""
    return Recipe(
        name=name,
        layout=layout,
        encoding="jpeg",
        reader=reader,
        decoder="simplejpeg in map_batches tasks, the whole image",
        transform=TRANSFORM,
        loader=loader,
        parallelism="Ray tasks on ray.init(num_cpus=cores), one CPU each; Ray's raylet and "
                    "GCS run beside them",
        output="uint8 (B, 224, 224, 3) torch tensor from iter_torch_batches (storebench's "
               "Batch holds its NumPy view)",
        doc=TRAINING_GUIDE,
        tuning=TUNING,
        cannot={OBJECT_STORAGE: "storebench runs Ray Data's readers over local files only "
                                "(Ray reads S3 itself, unmeasured here)"},
        distributions=("simplejpeg", "pillow", "torch", "pyarrow"),
        note=NO_RESUME,
    )
