"""Loaders: datasets over a Reader, samplers, batching, prefetchers, framework paths, feeders.

Compose them: ``reader -> LazyDataset / PreloadedDataset -> BatchSampler(sampler) ->
ThreadPrefetcher / ProcessPrefetcher -> GpuFeeder``. Torch and TensorFlow are imported only
inside the functions that use them (``storebench.loaders.torch_adapter``, ``.tf_adapter``).
Per-sample transforms (``Resize``, ``ResizeShorter``, ``CenterCrop``, ``Compose``) give images
of different sizes one shape before batching; ``RandomResizedCropFlip`` is the standard
training transform, seeded per (seed, epoch, sample) so every path delivers the same pixels;
``StepInput`` turns a batch into the tensor a training step takes.
"""

from .baselines import BaselineLockedListPrefetcher, BaselinePickledQueuePrefetcher
from .batching import Batch, batch_buffer, collate_padded, stack_into
from .datasets import DECODERS, InsufficientMemoryError, LazyDataset, PreloadedDataset
from .gpu import (
    AcceleratorUnavailableError,
    EmulatedAccelerator,
    FeedResult,
    GpuFeeder,
    read_ahead_batches,
    run_feed,
)
from .prefetch import ProcessPrefetcher, ThreadPrefetcher, WorkerDiedError, WorkerError
from .samplers import (
    BatchSampler,
    BlockShuffleSampler,
    FirstSamples,
    SequentialSampler,
    ShuffleSampler,
    merge_rank_states,
)
from .step_input import StepInput
from .train_transform import RandomResizedCropFlip, ReducedDecodeReport, reduced_decode_psnr
from .transforms import (
    CenterCrop,
    Compose,
    ImageTooSmallError,
    ImageTransform,
    Resize,
    ResizeShorter,
)
from .window import OrderedWindow, WorkerStartError

__all__ = [
    "DECODERS",
    "AcceleratorUnavailableError",
    "BaselineLockedListPrefetcher",
    "BaselinePickledQueuePrefetcher",
    "Batch",
    "BatchSampler",
    "BlockShuffleSampler",
    "CenterCrop",
    "Compose",
    "EmulatedAccelerator",
    "FeedResult",
    "FirstSamples",
    "GpuFeeder",
    "ImageTooSmallError",
    "ImageTransform",
    "InsufficientMemoryError",
    "LazyDataset",
    "OrderedWindow",
    "PreloadedDataset",
    "ProcessPrefetcher",
    "RandomResizedCropFlip",
    "ReducedDecodeReport",
    "Resize",
    "ResizeShorter",
    "SequentialSampler",
    "ShuffleSampler",
    "StepInput",
    "ThreadPrefetcher",
    "WorkerDiedError",
    "WorkerError",
    "WorkerStartError",
    "batch_buffer",
    "collate_padded",
    "merge_rank_states",
    "read_ahead_batches",
    "reduced_decode_psnr",
    "run_feed",
    "stack_into",
]
