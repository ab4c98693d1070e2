"""The same datasets through ``torch.utils.data.DataLoader``.

``torch_dataloader`` builds a DataLoader that fetches whole batches with one ``read_many``
(``__getitems__``), orders them with our samplers (``batch_sampler=BatchSampler(...)``), and
collates into tensors without a per-sample stack. In worker processes each batch is written
straight into a shared-memory tensor, the way PyTorch's own ``default_collate`` allocates
its output there, so that handing it to the main process copies nothing.

Datasets of images of different sizes work the same way: with a fixed-output transform
(``Resize``, ``CenterCrop``) on the dataset, each worker decodes and resizes per sample and
writes into one (B, H, W, 3) tensor; decoded without one, a batch's images are a list of
(H, W, 3) tensors, each its own shape.

``torch_dataloader`` returns a ``ResumableDataLoader``: a DataLoader with ``state_dict`` /
``load_state_dict`` (torch's ``Stateful`` protocol) that count the batches it has delivered,
not those its workers read ahead (see ``storebench.loaders.samplers`` for what a resume
delivers, at the same or another world size).

Importing this module imports torch.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.utils.data

from .batching import Batch
from .resume import Delivered
from .samplers import BatchSampler, SequentialSampler


class TorchBatchDataset(torch.utils.data.Dataset):
    """Wraps a ``LazyDataset`` / ``PreloadedDataset`` so that ``__getitems__`` returns a
    ``Batch`` whose images are already a tensor (a shared-memory one inside workers)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, label = self.dataset[index]
        return (as_tensor(image) if isinstance(image, np.ndarray) else image, label)

    def __getitems__(self, indices) -> Batch:
        idx = np.asarray(indices, dtype=np.int64)
        shape = self.dataset.sample_shape
        if shape is None:
            return self.dataset.get_batch(idx)
        images = torch.empty(
            (len(idx), *shape), dtype=torch.from_numpy(np.empty(0, self.dataset.sample_dtype)).dtype
        )
        if torch.utils.data.get_worker_info() is not None:
            images.share_memory_()
        batch = self.dataset.get_batch(idx, out=images.numpy())
        if not np.shares_memory(batch.images, images.numpy()):
            images.numpy()[...] = batch.images
        return Batch(images, batch.labels, idx)


def as_tensor(image: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``image``'s memory, or over a copy when it is read-only (Pillow's
    arrays are): torch cannot guard a read-only buffer and warns about it."""
    return torch.from_numpy(image if image.flags.writeable else image.copy())


def collate_batch(batch):
    """``collate_fn`` for ``TorchBatchDataset``: a ``Batch`` -> ``(images, labels)`` tensors.
    Encoded (list) images stay a list of bytes; differently shaped decoded images (a
    variable-size set without a resizing transform) become a list of tensors."""
    if isinstance(batch, Batch):
        images = batch.images
        if isinstance(images, np.ndarray):
            images = torch.from_numpy(images)
        elif isinstance(images, list):
            images = [as_tensor(x) if isinstance(x, np.ndarray) else x for x in images]
        return images, torch.from_numpy(np.ascontiguousarray(batch.labels))
    return torch.utils.data.default_collate(batch)


class ResumableDataLoader(torch.utils.data.DataLoader):
    """A DataLoader over a ``TorchBatchDataset`` and a storebench ``BatchSampler`` whose
    state is the samples it has delivered: ``state_dict()`` after batch b, loaded into a
    new loader (any ``num_workers``), delivers the rest of the epoch."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._delivered = Delivered(self.batch_sampler)

    def __iter__(self):
        for images, labels in super().__iter__():
            self._delivered.add(len(labels))
            yield images, labels

    def state_dict(self) -> dict:
        return self._delivered.loader_state(self.dataset.dataset)

    def load_state_dict(self, state_dict: dict) -> None:
        self._delivered.load(state_dict, self.dataset.dataset)


def close_workers(loader: torch.utils.data.DataLoader) -> None:
    """Stop a ``persistent_workers`` loader's workers now, as its garbage collection would:
    they outlive every pass, and nothing else stops them before the loader is dropped."""
    iterator = getattr(loader, "_iterator", None)
    loader._iterator = None
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed Python's and NumPy's global RNGs from the seed torch gave
    this worker (derived from the DataLoader's ``generator``), as PyTorch's reproducibility
    notes recommend, so that transforms using them differ per worker and repeat per run."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)  # seeding third-party transforms that use it
    random.seed(seed)


def torch_dataloader(
    dataset,
    *,
    batch_size: int,
    sampler=None,
    drop_last: bool = False,
    num_workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    multiprocessing_context: str | None = None,
    seed: int = 0,
    timeout: float = 0,
) -> torch.utils.data.DataLoader:
    """A ``ResumableDataLoader`` over ``dataset``: ``(images, labels)`` tensors in
    ``sampler``'s order (default: sequential). ``seed`` seeds the loader's generator, from
    which torch derives each worker's seed. ``pin_memory=True`` needs CUDA and is refused
    without it.
    """
    if pin_memory and not torch.cuda.is_available():
        from .gpu import AcceleratorUnavailableError

        raise AcceleratorUnavailableError(
            f"pin_memory=True needs a CUDA device, but torch {torch.__version__} reports "
            "torch.cuda.is_available() == False on this machine; use pin_memory=False"
        )
    if num_workers == 0 and (persistent_workers or prefetch_factor is not None):
        raise ValueError("persistent_workers and prefetch_factor need num_workers > 0")
    sampler = sampler if sampler is not None else SequentialSampler(len(dataset))
    generator = torch.Generator()
    generator.manual_seed(seed)
    options = {}
    if num_workers > 0:
        options = {
            "persistent_workers": persistent_workers,
            "prefetch_factor": prefetch_factor if prefetch_factor is not None else 2,
            "multiprocessing_context": multiprocessing_context,
        }
    return ResumableDataLoader(
        TorchBatchDataset(dataset),
        batch_sampler=BatchSampler(sampler, batch_size, drop_last=drop_last),
        collate_fn=collate_batch,
        num_workers=num_workers,
        pin_memory=pin_memory,
        worker_init_fn=seed_worker if num_workers > 0 else None,
        generator=generator,
        timeout=timeout,
        **options,
    )
