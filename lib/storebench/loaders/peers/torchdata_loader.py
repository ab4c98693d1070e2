"""torchdata's ``StatefulDataLoader`` over our datasets: the torch DataLoader path, resumable.

What torchdata recommends: ``torchdata.stateful_dataloader.StatefulDataLoader`` as a drop-in
replacement for ``torch.utils.data.DataLoader``, whose ``state_dict()`` taken mid-epoch and
``load_state_dict()`` in a new loader resume the epoch where it stopped (the reason it
exists: checkpointing a training run between two batches).

What is used: the same DataLoader as the ``torch`` path (``torch_adapter.torch_dataloader``):
our ``LazyDataset`` / ``PreloadedDataset`` behind ``TorchBatchDataset`` (one ``read_many``
per batch, written into a shared-memory tensor in workers), ``batch_sampler=BatchSampler(our
sampler, batch_size)``, ``num_workers=options.workers``, ``multiprocessing_context=
options.start_method``, the generator seeded from ``options.seed`` and ``seed_worker``.
Only the class differs, and the collate step keeps each batch's sample indices:
batches are ``Batch(images, labels, indices)`` with NumPy images (the tensor's memory, not a
copy). Decoding is the dataset's (``decode`` in the case), as on the torch path.

Resuming. Our ``BatchSampler`` is ``Stateful``: torchdata saves its ``state_dict`` with
each snapshot, taken as a batch is sent to a worker and kept until that batch is delivered, so
the state it hands back counts the batches delivered; the new loader loads it into its
sampler, which resumes the epoch (its seed and epoch come from the state) without skipping
through the batches already delivered.

Errors. torch re-raises a worker's exception in the main process by calling its class with
one message, which our ``CorruptSampleError(path, index, reason)`` cannot take (the torch path
then gets a ``RuntimeError``): inside workers a reader's ``DatasetError`` is re-raised as a
plain ``DatasetError`` with the same message (file and sample), so the main process gets a
``DatasetError`` naming the file.

``close()`` shuts down the workers of an epoch left unfinished (a ``break``), which the
loader keeps alive for ``state_dict()``; a finished epoch has already ended them.
"""

from __future__ import annotations

import numpy as np

from ..batching import Batch
from ..paths import PathOptions
from . import shut_down_dataloader_workers


class WorkerSafeBatchDataset:
    """``TorchBatchDataset(dataset)`` whose reader errors, inside workers, are plain
    ``DatasetError``s that torch can re-raise as they are (see the module docstring).
    A module-level class, so that spawned workers can unpickle it."""

    def __init__(self, dataset) -> None:
        from ..torch_adapter import TorchBatchDataset

        self.batches = TorchBatchDataset(dataset)

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int):
        return self._guarded(self.batches.__getitem__, index)

    def __getitems__(self, indices):
        return self._guarded(self.batches.__getitems__, indices)

    @staticmethod
    def _guarded(read, argument):
        import torch.utils.data

        from ...formats import DatasetError

        try:
            return read(argument)
        except DatasetError as err:
            if type(err) is DatasetError or torch.utils.data.get_worker_info() is None:
                raise
            raise DatasetError(f"{type(err).__name__}: {err}") from err


def collate_with_indices(batch):
    """``collate_fn``: the ``Batch`` ``TorchBatchDataset.__getitems__`` returns (its images a
    tensor, in shared memory inside workers, or a list of encoded bytes), kept whole so that
    its indices reach the main process."""
    import torch

    if not isinstance(batch, Batch):
        raise TypeError(f"expected the dataset's Batch, got {type(batch).__name__}")
    images = batch.images
    if isinstance(images, np.ndarray):
        images = torch.from_numpy(images)
    return Batch(images, np.ascontiguousarray(batch.labels, dtype=np.int64),
                 np.ascontiguousarray(batch.indices, dtype=np.int64))


def _numpy_batch(batch: Batch) -> Batch:
    images = batch.images
    if hasattr(images, "numpy") and not isinstance(images, np.ndarray):
        images = images.numpy()
    return Batch(images, batch.labels, batch.indices)


class StatefulBatches:
    """A ``StatefulDataLoader`` yielding ``Batch`` with NumPy images; ``state_dict`` and
    ``load_state_dict`` are the loader's."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __iter__(self):
        for batch in self.loader:
            yield _numpy_batch(batch)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def close(self) -> None:
        shut_down_dataloader_workers(getattr(self.loader, "_iterator", None))
        self.loader._iterator = None


def stateful_dataloader(dataset, sampler, options: PathOptions):
    """The ``StatefulDataLoader`` of the torchdata path (see the module docstring)."""
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    from ..samplers import SequentialSampler
    from ..torch_adapter import EpochBatchSampler, seed_worker

    if dataset is None:
        raise ValueError("the torchdata path reads through our dataset: dataset is None")
    sampler = sampler if sampler is not None else SequentialSampler(len(dataset))
    generator = torch.Generator()
    generator.manual_seed(options.seed)
    workers = {}
    if options.workers > 0:
        workers = {"multiprocessing_context": options.start_method, "prefetch_factor": 2,
                   "worker_init_fn": seed_worker}
    return StatefulDataLoader(
        WorkerSafeBatchDataset(dataset),
        # Batches tagged with the sampler's epoch: a seeded training crop in the workers'
        # dataset copies crops as every storebench path does.
        batch_sampler=EpochBatchSampler(sampler, options.batch_size),
        collate_fn=collate_with_indices,
        num_workers=options.workers,
        generator=generator,
        **workers,
    )


def torchdata_batches(dataset, sampler, options: PathOptions):
    """``(StatefulBatches, close)`` over ``dataset`` in ``sampler``'s order."""
    batches = StatefulBatches(stateful_dataloader(dataset, sampler, options))
    return batches, batches.close
