"""The startup study's case: a loader over an index of ImageNet's size
(``storebench.loaders.index``), from its creation to its first batches, or through a whole
epoch of the index.

A case builds the index (``index_kind``: ``arrays`` or ``lists``; ``index_size`` entries
over the profile's raw memmap set), then, timed, makes the loader (``case.prefetcher``:
``thread``, ``process`` or ``torch``; param ``start_method``) and reads batches:

- ``time_to_first_batch_s``: from before the loader is made to its first batch;
- ``first_worker_start_s`` / ``last_worker_start_s``: from the same instant to when the
  first and the last worker began their first batch (each notes it from inside the
  worker: its dataset had arrived by then);
- ``pickled_bytes_per_worker``: the bytes each worker is sent, measured as the path sends
  them: ProcessPrefetcher's ``pack_for_workers`` payload, torch's worker arguments that
  carry data (its dataset, collate_fn and worker_init_fn) through multiprocessing's
  ``ForkingPickler``; 0 under fork (inherited) and for threads (shared).

A startup case reads until every worker has delivered (at least ``workers`` batches). A case
with param ``epoch`` reads the whole index once (its ``samples``) and also reports memory:
``cgroup_peak_bytes``, the kernel's peak charge of a memory cgroup made for the case before
the index is built (index, loader and workers; ``bench.memory_budget``), or where none can
be made ``maxrss_sum_bytes`` (this process's peak RSS plus its largest reaped child's);
and the growth of each worker's private memory from the first batch to the last
(``worker_uss_growth_bytes``, Private_Clean + Private_Dirty, and
``worker_private_dirty_growth_bytes``, the mean over workers), from
``/proc/<pid>/smaps_rollup``. Reading a Python list in a forked worker increments each
entry's reference count, which copies the page that holds it: that growth is the
copy-on-read effect. The first batches are checked against the set (the sampler's order,
the set's pixels at the entries' offsets, the index's labels).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import time

import numpy as np

from ...bench.case import Case, Trial

CHECKED_BATCHES = 2


def _index(case: Case, reader):
    from ...loaders.index import make_index, set_labels

    return make_index(str(case.param("index_kind")), set_labels(reader.spec),
                      int(case.param("index_size")))


def pickled_bytes(path: str, start_method: str | None, dataset) -> int:
    """Bytes each worker of ``path`` is sent (see the module doc)."""
    if path == "thread" or start_method == "fork":
        return 0
    from multiprocessing.reduction import ForkingPickler

    if path == "process":
        from ...loaders.prefetch import pack_for_workers

        return len(pack_for_workers("ProcessPrefetcher", start_method, (dataset, None)))
    from ...loaders.peers.torchdata_loader import collate_with_indices
    from ...loaders.torch_adapter import TorchBatchDataset

    return len(ForkingPickler.dumps((TorchBatchDataset(dataset), collate_with_indices, None)))


class _Loader:
    """The case's loader: ``batches`` (an iterator of ``Batch``), ``pids`` of its worker
    processes once started, ``close()``."""

    def __init__(self, path: str, dataset, batches, *, workers: int,
                 start_method: str | None) -> None:
        self.path = path
        self._torch_iterator = None
        if path == "thread":
            from ...loaders.prefetch import ThreadPrefetcher

            self._loader = ThreadPrefetcher(dataset, batches, workers=workers)
            self.batches = iter(self._loader)
        elif path == "process":
            from ...loaders.prefetch import ProcessPrefetcher

            self._loader = ProcessPrefetcher(dataset, batches, workers=workers,
                                             start_method=start_method)
            self.batches = iter(self._loader)
        elif path == "torch":
            self.batches = self._torch(dataset, batches, workers, start_method)
        else:
            raise ValueError(f"startup cases run thread, process or torch, not {path!r}")

    def _torch(self, dataset, batches, workers: int, start_method: str | None):
        import torch.utils.data

        from ...loaders.batching import Batch
        from ...loaders.peers.torchdata_loader import collate_with_indices
        from ...loaders.torch_adapter import TorchBatchDataset

        loader = torch.utils.data.DataLoader(
            TorchBatchDataset(dataset), batch_sampler=batches,
            collate_fn=collate_with_indices, num_workers=workers,
            multiprocessing_context=start_method, prefetch_factor=2)
        self._torch_iterator = iter(loader)
        return (Batch(b.images.numpy(), b.labels, b.indices) for b in self._torch_iterator)

    @property
    def pids(self) -> list[int]:
        if self.path == "process":
            return list(self._loader.pids)
        if self._torch_iterator is not None:
            return [w.pid for w in getattr(self._torch_iterator, "_workers", ())]
        return []

    def close(self) -> None:
        if self._torch_iterator is not None:
            from ...loaders.peers import shut_down_dataloader_workers

            shut_down_dataloader_workers(self._torch_iterator)
        elif hasattr(self, "_loader"):
            self._loader.close()


def _private(pids: list[int]) -> tuple[float, float]:
    """Mean (USS, Private_Dirty) bytes over ``pids``."""
    from ...bench.metrics import smaps_rollup

    found = [f for f in map(smaps_rollup, pids) if f is not None]
    if not found:
        return math.nan, math.nan
    uss = [f.get("Private_Clean", 0) + f.get("Private_Dirty", 0) for f in found]
    return float(np.mean(uss)), float(np.mean([f.get("Private_Dirty", 0) for f in found]))


def _check(case: Case, reader, index, kept: list, wanted: list[np.ndarray]) -> None:
    """The first batches: the sampler's order, the set's pixels at the entries' offsets,
    the index's labels."""
    for batch, order in zip(kept, wanted):
        where = f"{case.dataset}: {case.prefetcher} over a {len(index):,}-entry index"
        if not np.array_equal(batch.indices, order):
            raise RuntimeError(f"{where} delivered entries out of the sampler's order")
        _, labels, offsets = index.lookup(order)
        images, _ = reader.read_many(offsets)
        if not np.array_equal(batch.labels, labels) or not np.array_equal(batch.images,
                                                                           images):
            raise RuntimeError(f"{where} delivered samples that differ from the set's")


def _read(loader: _Loader, *, total: int, epoch: bool, workers: int, stamps, started: float,
          keep: list) -> dict:
    """Batches until every worker delivered (or, with ``epoch``, all ``total``)."""
    from ...loaders.batching import Batch

    out = {"samples": 0, "batches": 0}
    for batch in loader.batches:
        now = time.monotonic()
        if out["batches"] == 0:
            out["first"] = now - started
            out["start_private"] = _private(loader.pids)
        if len(keep) < CHECKED_BATCHES:
            # Copies: the prefetchers' slots are reused for later batches.
            keep.append(Batch(np.array(batch.images), np.array(batch.labels),
                              np.array(batch.indices)))
        out["batches"] += 1
        out["samples"] += len(batch)
        if epoch and out["batches"] == total - 1:
            out["end_private"] = _private(loader.pids)  # before the last: workers still up
        if not epoch and out["batches"] >= workers and len(stamps.read()) >= workers:
            break
    return out


def startup_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """See the module docstring."""
    from ...formats import open_dataset
    from ...loaders import ShuffleSampler
    from ...loaders.index import IndexedDataset, StartStamps
    from ...loaders.samplers import BatchSampler

    epoch = bool(case.param("epoch", False))
    method = case.param("start_method")
    workers = int(case.workers or 1)
    reader = open_dataset(case.dataset, verify=False)
    directory = tempfile.mkdtemp(prefix="storebench-startup-")
    loader = None
    try:
        with _memory(epoch) as memory, contextlib.ExitStack() as stack:
            if epoch:  # built inside the cgroup: its pages count
                index = _index(case, reader)
            else:
                index = stack.enter_context(trial.kept(
                    ("index", case.param("index_kind"), case.param("index_size")),
                    lambda: contextlib.nullcontext(_index(case, reader))))
            stamps = StartStamps(directory)
            dataset = IndexedDataset(reader, index, stamps=stamps)
            sampler = ShuffleSampler(len(index), seed=int(case.param("seed", 0)))
            batches = BatchSampler(sampler, case.batch_size)
            total = len(batches)
            wanted = [np.asarray(b, dtype=np.int64) for b, _ in zip(batches,
                                                                    range(CHECKED_BATCHES))]
            kept: list = []
            with trial.measure():
                started = time.monotonic()
                loader = _Loader(case.prefetcher, dataset, batches, workers=workers,
                                 start_method=method)
                got = _read(loader, total=total, epoch=epoch, workers=workers, stamps=stamps,
                            started=started, keep=kept)
            loader.close()
            loader = None
            peak = memory() if epoch else {}
        starts = sorted(t - started for t in stamps.read().values())
        _check(case, reader, index, kept, wanted)
        if len(starts) < workers:
            raise RuntimeError(f"{case.case_id}: {len(starts)} of {workers} workers noted "
                               "their start")
        metrics = {
            "time_to_first_batch_s": (got["first"], "s"),
            "first_worker_start_s": (starts[0], "s"),
            "last_worker_start_s": (starts[-1], "s"),
            "pickled_bytes_per_worker": (float(pickled_bytes(case.prefetcher, method,
                                                             dataset)), "bytes"),
            "index_entries": (float(len(index)), "count"),
            "samples": (float(got["samples"]), "count"),
        }
        if epoch:
            metrics.update(_epoch_metrics(case, got, total, len(index), peak))
        return metrics
    finally:
        if loader is not None:
            loader.close()
        reader.close()
        shutil.rmtree(directory, ignore_errors=True)


def _epoch_metrics(case: Case, got: dict, total: int, entries: int, peak: dict) -> dict:
    if got["samples"] != entries:
        raise RuntimeError(f"{case.case_id}: the epoch delivered {got['samples']} of "
                           f"{entries} entries")
    metrics = dict(peak)
    if case.prefetcher != "thread" and "end_private" in got:
        (uss0, dirty0), (uss1, dirty1) = got["start_private"], got["end_private"]
        metrics["worker_uss_start_bytes"] = (uss0, "bytes")
        metrics["worker_uss_growth_bytes"] = (uss1 - uss0, "bytes")
        metrics["worker_private_dirty_growth_bytes"] = (dirty1 - dirty0, "bytes")
    return {k: v for k, v in metrics.items() if not math.isnan(v[0])}


@contextlib.contextmanager
def _memory(enabled: bool):
    """Yields ``peak()``: the case's peak memory, kernel-measured in a cgroup made for it
    where one can be made, else summed ru_maxrss (see the module doc)."""
    if not enabled:
        yield dict
        return
    from ...bench.memory_budget import BudgetUnavailable, MemoryBudget

    try:
        budget = MemoryBudget(None, name="startup")
        budget.__enter__()
    except BudgetUnavailable:
        budget = None
    try:
        def peak() -> dict:
            if budget is not None:
                return {"cgroup_peak_bytes": (float(budget.stats().peak_bytes), "bytes")}
            import resource

            total = sum(resource.getrusage(who).ru_maxrss
                        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
            return {"maxrss_sum_bytes": (float(total) * 1024, "bytes")}

        yield peak
    finally:
        if budget is not None:
            budget.__exit__(None, None, None)
