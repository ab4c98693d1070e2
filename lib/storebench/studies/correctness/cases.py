"""The correctness study's cases: one recipe's runs over a set of probe images, audited from
what the recipe delivers.

The set (``write_identified_probes``): ``samples`` probe images (``recipes.probe``: red is
the column, green the row, so any delivered crop gives back its box and flip), each in a
class of its own, so that a delivered label names its sample with nothing of ours in the
loader; the blue channel carries a tag of the index too, so that a label delivered with
another sample's pixels is caught. A case imports it into its recipe's layout, in a
temporary directory of its own (the study's sets never join the profile's, which every other
study reads).

``audit_case`` runs, in one process, every run of one recipe the properties share:

- ranks first (``storebench.ranks``: gloo, forked before any loader or library has started
  a thread in this process): one epoch at 2, 3 and 4 ranks, each rank ``RANK_WORKERS``
  worker, ``drop_last`` off;
- a worker killed mid-epoch (``killed_worker_epoch``, forked like a rank): epoch 0 at
  ``REFERENCE_WORKERS`` workers, the loader's oldest worker process killed once
  ``KILL_AFTER_SHARE`` of it is delivered, then read on;
- run A, ``REFERENCE_WORKERS`` workers, seed ``SEED``: epochs 0 and 1, then (where the epoch
  is the sampler's to be told) a pass without ``set_epoch``;
- run B, the same seed and workers afresh: the first ``COMPARED_SAMPLES`` samples;
- runs at 1 and 4 workers: one epoch each (tf.data has no worker count: AUTOTUNE).

Metrics (``metric_name``): ``exactly_once.<setting>.<count>``, ``randomness.<what>.<share>``,
``determinism.<what>.<share>``, ``shuffle.<measure>``, ``killed_worker.<setting>.<what>``.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...bench.case import Case, CaseSkipped, Trial
from ...recipes.probe import PROBE_QUALITY, PROBE_SIDE, CropBox, probe_pixels
from .measures import (
    count_deliveries,
    longest_stored_run,
    pooled_correlation,
    recover_boxes,
    same_draws,
    same_order,
    sequence_matches,
    shared_draws,
    storage_rank_correlation,
)

SEED = 11
WORKER_COUNTS = (1, 2, 4)
REFERENCE_WORKERS = 2
RANK_COUNTS = (2, 3, 4)
# Each rank's workers: one, so that 4 ranks do not crowd a small machine's cores (the split
# over ranks is the sampler's, whatever each rank's workers).
RANK_WORKERS = 1
# Samples a second run of the same seed, and a pass without set_epoch, are compared over:
# enough to tell "the same" (every one) from "independent" (almost none).
COMPARED_SAMPLES = 512
RANKS_TIMEOUT_S = 240.0
# The blue channel's tag: index modulo TAG_LEVELS, TAG_STEP grey levels apart (a JPEG's
# mean blue strays by a tenth of a level).
TAG_LEVELS = 32
TAG_STEP = 8

# A worker killed mid-epoch: once this share of the epoch is delivered, the loader's oldest
# worker process gets SIGKILL and the epoch is read on; a run not over KILLED_TIMEOUT_S
# after it started (a small probe set's epoch takes seconds) counts as a hang.
KILL_AFTER_SHARE = 0.25
KILLED_TIMEOUT_S = 120.0
# Processes multiprocessing starts beside a loader's workers: not workers, never killed.
HELPER_PROCESSES = ("resource_tracker", "semaphore_tracker", "forkserver")
# Paths whose workers may not outnumber the cores (FFCV's numba threads refuse), and why:
# their larger worker counts are not run on a smaller machine.
CORE_BOUND = {"ffcv": "FFCV's numba threads cannot outnumber the cores"}
# Paths whose parallelism is not a worker count: run at REFERENCE_WORKERS only.
NO_WORKER_COUNT = {"tf_data": "tf.data sizes its own parallel calls (AUTOTUNE): there is no "
                              "worker count to change"}


def pixel_tag(index: int) -> int:
    """The blue level sample ``index`` carries."""
    return TAG_STEP // 2 + TAG_STEP * (int(index) % TAG_LEVELS)


def read_tags(images: np.ndarray) -> np.ndarray:
    """The tag (index modulo ``TAG_LEVELS``) each delivered image's blue channel carries."""
    levels = np.asarray(images)[..., 2].mean(axis=(1, 2), dtype=np.float64)
    return np.round((levels - TAG_STEP // 2) / TAG_STEP).astype(np.int64) % TAG_LEVELS


def write_identified_probes(root: Path | str, count: int) -> Path:
    """An ImageFolder of ``count`` probe JPEGs under ``root``, sample ``i`` alone in class
    ``i`` (folders sort as the indices do) with its tag in the blue channel."""
    from PIL import Image

    root = Path(root)
    pixels = probe_pixels()
    for index in range(count):
        folder = root / f"{index:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels[..., 2] = pixel_tag(index)
        Image.fromarray(pixels).save(folder / "probe.jpg", quality=PROBE_QUALITY)
    return root


def probe_knobs(layout: str, count: int) -> dict:
    """Knobs for a probe set: WebDataset splits whole shards over ranks and workers, so it
    needs at least as many shards as ranks times workers (its docs advise many more), which
    its default shard size does not cut a small set into."""
    if layout == "webdataset":
        most = max(RANK_COUNTS) * max(WORKER_COUNTS)
        return {layout: {"samples_per_shard": max(1, math.ceil(count / most))}}
    return {}


def build_probe_set(recipe, root: Path | str, count: int) -> Path:
    """The probe set in ``recipe``'s layout under ``root``; checks that stored sample ``i``
    holds label ``i`` (the audits read a label as the sample's index)."""
    from ...formats import open_dataset
    from ...importer import import_images

    root = Path(root)
    source = write_identified_probes(root / "source", count)
    # The probes are already the probe's size: a resize only where the layout stores raw
    # pixels (it would also write a raw copy of every encoded layout).
    resize = (PROBE_SIDE, PROBE_SIDE) if recipe.encoding == "raw" else None
    import_images(source, root / "sets", formats=[recipe.layout], resize=resize,
                  progress=False, knobs=probe_knobs(recipe.layout, count))
    path = root / "sets" / f"{recipe.layout}-{recipe.encoding}"
    reader = open_dataset(path)
    try:
        _, labels = reader.read_many(np.arange(count))
    finally:
        reader.close()
    if not np.array_equal(labels, np.arange(count)):
        raise RuntimeError(f"{path}: stored labels are not the sample indices")
    return path


# -- reading what a recipe delivers --------------------------------------------------------
@dataclass
class Delivered:
    """One pass's deliveries, in order: each sample's label, its draw, and how many
    images carried another sample's tag than their label's."""

    labels: list[int] = field(default_factory=list)
    boxes: list[CropBox] = field(default_factory=list)
    tag_mismatches: int = 0

    def draws(self) -> dict[int, CropBox]:
        """Sample -> its first delivered draw."""
        out: dict[int, CropBox] = {}
        for label, box in zip(self.labels, self.boxes):
            out.setdefault(label, box)
        return out

    def add(self, images, labels) -> None:
        images, labels = np.asarray(images), np.asarray(labels).reshape(-1)
        self.labels += [int(label) for label in labels]
        self.boxes += recover_boxes(images)
        tags = read_tags(images)
        self.tag_mismatches += int((tags != labels % TAG_LEVELS).sum())

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray, int]:
        """Picklable form (a rank's result)."""
        from .measures import draw_array

        return np.asarray(self.labels, np.int64), draw_array(self.boxes), self.tag_mismatches

    @classmethod
    def from_arrays(cls, labels, draws, mismatches) -> Delivered:
        boxes = [CropBox(*row[:4], bool(row[4])) for row in np.asarray(draws)]
        return cls([int(x) for x in labels], boxes, int(mismatches))


def batch_parts(batch) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels) of a delivered batch: a ``Batch``, or a framework's (images,
    labels) pair."""
    if hasattr(batch, "images"):
        return np.asarray(batch.images), np.asarray(batch.labels)
    images, labels = batch[0], batch[1]
    return np.asarray(images), np.asarray(labels)


def read_pass(batches, limit: int | None = None) -> Delivered:
    """Every sample of one pass over ``batches`` (the first ``limit`` or more)."""
    delivered = Delivered()
    for batch in batches:
        delivered.add(*batch_parts(batch))
        if limit is not None and len(delivered.labels) >= limit:
            break
    return delivered


# -- opening a recipe as one rank ----------------------------------------------------------
def open_rank(recipe, root: str, *, batch_size: int, workers: int, seed: int, rank: int,
              world_size: int):
    """``recipe``'s pipeline as rank ``rank`` of ``world_size``, as a ``RecipeRun``: over
    storebench's reader, its sampler's rank split (``drop_last`` off: shares padded to even
    length); a peer that reads its own files, its library's own split (``Recipe.open``);
    tf.data, its own record split (``tf.distribute.InputContext``, whose batch size is the
    global one)."""
    from ...loaders.paths import PathOptions
    from ...recipes.base import RecipeRun

    if recipe.loader == "tf_data":
        import tensorflow as tf

        from ...loaders.paths import TRAINING_CROP
        from ...loaders.tf_adapter import tfrecord_pipeline

        context = tf.distribute.InputContext(num_input_pipelines=world_size,
                                             input_pipeline_id=rank,
                                             num_replicas_in_sync=world_size)
        # Record shares need one common record order: a deterministic interleave.
        pipeline = tfrecord_pipeline(Path(root), batch_size=batch_size * world_size,
                                     shuffle_buffer=PathOptions(1).shuffle_buffer, seed=seed,
                                     deterministic=True, resize=(TRAINING_CROP,) * 2,
                                     random_crop=True, input_context=context,
                                     shard_by="record")
        return RecipeRun(pipeline)
    return recipe.open(root, batch_size=batch_size, workers=workers, seed=seed, rank=rank,
                       world_size=world_size)


def rank_epoch(rank: int, world_size: int, recipe_name: str, root: str, batch_size: int,
               workers: int, seed: int):
    """In a rank: epoch 0 of this rank's share, as picklable arrays."""
    from ...recipes import get_recipe

    recipe = get_recipe(recipe_name)
    with open_rank(recipe, root, batch_size=batch_size, workers=workers, seed=seed,
                   rank=rank, world_size=world_size) as run:
        return read_pass(run.epoch(0)).to_arrays()


def ray_data_rank_epoch(rank: int, world_size: int, recipe_name: str, root: str,
                        batch_size: int, workers: int, seed: int, splits: int) -> list:
    """In a process of its own: epoch 0 of a Ray Data recipe split ``splits`` ways by
    ``Dataset.streaming_split`` from one driver (Ray's way to feed ranks), each split's
    share as picklable arrays."""
    from ...loaders.paths import PathOptions
    from ...loaders.peers.ray_data import rank_epochs
    from ...recipes import get_recipe

    recipe = get_recipe(recipe_name)
    options = PathOptions(batch_size=batch_size, workers=workers, seed=seed, root=root,
                          decode=recipe.decode, transform="train")
    shares = []
    for batches in rank_epochs(root, splits, options):
        delivered = Delivered()
        for batch in batches:
            delivered.add(*batch_parts(batch))
        shares.append(delivered.to_arrays())
    return shares


def run_ranks_epoch(recipe, root: str, world_size: int, *, batch_size: int,
                    workers: int) -> list[Delivered]:
    # Imported before the fork (it starts no thread), not again in every rank.
    import torch.distributed  # noqa: F401

    from ...loaders.peers.ray_data import RAY_DATA_PATHS
    from ...ranks import run_ranks

    if recipe.loader in RAY_DATA_PATHS:
        # One driver splits the epoch (streaming_split); spawned, so that this process
        # forks its later runs before any Ray thread exists in it.
        (shares,) = run_ranks(ray_data_rank_epoch, 1, start_method="spawn",
                              args=(recipe.name, root, batch_size, REFERENCE_WORKERS, SEED,
                                    world_size), timeout_s=RANKS_TIMEOUT_S)
        return [Delivered.from_arrays(*share) for share in shares]

    # Forked where the recipe's library allows it (fast); spawned where it does not (Lance,
    # which this process has used to check the set, hangs in a fork).
    method = "spawn" if recipe.start_method == "spawn" else "fork"
    results = run_ranks(rank_epoch, world_size, start_method=method,
                        args=(recipe.name, root, batch_size, workers, SEED),
                        timeout_s=RANKS_TIMEOUT_S)
    return [Delivered.from_arrays(*result) for result in results]


# -- a worker killed mid-epoch ---------------------------------------------------------------
def loader_worker_pids(before: set[int]) -> list[int]:
    """This process's descendants started since ``before`` (their pids), multiprocessing's
    helper processes left out, oldest first: the worker processes a loader started."""
    import psutil

    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.pid in before or child.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(helper in part for part in child.cmdline() for helper in HELPER_PROCESSES):
                continue
            found.append((child.create_time(), child.pid))
    return [pid for _, pid in sorted(found)]


def killed_worker_epoch(rank: int, world_size: int, recipe_name: str, root: str,
                        batch_size: int, workers: int, seed: int, kill_after: int) -> tuple:
    """In a process of its own: epoch 0 of ``recipe_name``, its oldest worker process
    killed (SIGKILL) once ``kill_after`` samples are delivered, then read on. Returns the
    delivered arrays, the worker processes found at the kill (0: its workers are threads,
    and the epoch stops there), the samples delivered before the kill, and whether reading
    on raised."""
    import signal

    import psutil

    from ...recipes import get_recipe

    recipe = get_recipe(recipe_name)
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    from ...loaders.peers.ray_data import RAY_DATA_PATHS, ray_worker_pids

    # Ray's workers are the raylet's children; its GCS and raylet are the engine.
    workers_of = ray_worker_pids if recipe.loader in RAY_DATA_PATHS else (
        lambda: loader_worker_pids(before))
    delivered = Delivered()
    processes, before_kill, raised = -1, 0, False
    try:
        with recipe.open(root, batch_size=batch_size, workers=workers, seed=seed) as run:
            for batch in run.epoch(0):
                delivered.add(*batch_parts(batch))
                if processes < 0 and len(delivered.labels) >= kill_after:
                    pids = workers_of()
                    processes, before_kill = len(pids), len(delivered.labels)
                    if not pids:
                        break
                    os.kill(pids[0], signal.SIGKILL)
    except Exception:  # noqa: BLE001 - what the loader raises on a dead worker is the finding
        raised = True
    return (*delivered.to_arrays(), max(processes, 0), before_kill, raised)


def killed_worker_metrics(recipe, root: str, samples: int, *, batch_size: int) -> dict:
    """A worker killed mid-epoch (``killed_worker_epoch``): how many worker processes the
    loader had, what it delivered after the kill (counted as exactly-once counts), whether
    it raised, and whether it hung."""
    from ...ranks import RankTimeoutError, run_ranks

    name = lambda measure: metric_name("killed_worker", "workers"  # noqa: E731
                                       f"{REFERENCE_WORKERS}", measure)
    kill_after = max(1, int(samples * KILL_AFTER_SHARE))
    method = "spawn" if recipe.start_method == "spawn" else "fork"
    try:
        ((labels, draws, mismatches, processes, before_kill, raised),) = run_ranks(
            killed_worker_epoch, 1, start_method=method, timeout_s=KILLED_TIMEOUT_S,
            args=(recipe.name, root, batch_size, REFERENCE_WORKERS, SEED, kill_after))
    except RankTimeoutError:
        return {name("hung"): (1, "count"), name("timeout_s"): (KILLED_TIMEOUT_S, "s")}
    out = {name("hung"): (0, "count"), name("worker_processes"): (processes, "count"),
           name("delivered_before_kill"): (before_kill, "count"),
           name("raised"): (int(raised), "count")}
    if processes:
        delivered = Delivered.from_arrays(labels, draws, mismatches)
        count = count_deliveries(delivered.labels, samples)
        out.update({name("delivered"): (count.delivered, "count"),
                    name("duplicates"): (count.duplicates, "count"),
                    name("misses"): (count.misses, "count"),
                    name("unknown"): (len(count.unknown), "count")})
    return out


# -- the metrics ---------------------------------------------------------------------------
def metric_name(group: str, setting: str, measure: str) -> str:
    return f"{group}.{setting}.{measure}"


def once_metrics(setting: str, delivered: Delivered, samples: int,
                 per_rank: list[int] | None = None) -> dict:
    count = count_deliveries(delivered.labels, samples, per_rank=per_rank)
    name = lambda measure: metric_name("exactly_once", setting, measure)  # noqa: E731
    return {name("delivered"): (count.delivered, "count"),
            name("duplicates"): (count.duplicates, "count"),
            name("misses"): (count.misses, "count"),
            name("unknown"): (len(count.unknown), "count"),
            name("padding"): (count.padding, "count"),
            name("tag_mismatches"): (delivered.tag_mismatches, "count")}


def rank_metrics(world_size: int, shares: list[Delivered], samples: int) -> dict:
    setting = f"ranks{world_size}"
    everything = Delivered([x for s in shares for x in s.labels],
                           [b for s in shares for b in s.boxes],
                           sum(s.tag_mismatches for s in shares))
    out = once_metrics(setting, everything, samples, per_rank=[len(s.labels) for s in shares])
    pairs = [(a, b) for i, a in enumerate(shares) for b in shares[i + 1:]]
    # A rank may get nothing (a library that hands out whole files, one file in the set):
    # only pairs of ranks that both delivered are compared, and with none, nothing is.
    matches = [sequence_matches(a.boxes, b.boxes) for a, b in pairs if a.boxes and b.boxes]
    if matches:
        out[metric_name("randomness", setting, "sequence_match_max")] = (max(matches),
                                                                          "ratio")
    correlation, compared = pooled_correlation([(a.boxes, b.boxes) for a, b in pairs])
    if compared:
        out[metric_name("randomness", setting, "draw_correlation")] = (correlation, "ratio")
    out[metric_name("randomness", setting, "draw_correlation_values")] = (compared, "count")
    out[metric_name("randomness", setting, "shared_draws")] = (
        shared_draws(list(everything.draws().values())), "ratio")
    return out


def run_passes(recipe, root: str, *, batch_size: int, workers: int,
               limits: Sequence[int | None], forget_set_epoch: bool = False) -> list:
    """One run of ``recipe`` seeded ``SEED``: epoch ``k`` for each ``limits[k]`` (its first
    that many samples, or all for None), then, with ``forget_set_epoch``, the last epoch's
    first ``COMPARED_SAMPLES`` again without telling the epoch (None where the library
    advances its epoch itself)."""
    import gc

    with recipe.open(root, batch_size=batch_size, workers=workers, seed=SEED) as run:
        passes = [read_pass(run.epoch(number), limit) for number, limit in enumerate(limits)]
        if forget_set_epoch:
            passes.append(read_pass(run.batches, COMPARED_SAMPLES) if run.sampler is not None
                          else None)
    # A run does not close its reader: let it go before the next run opens the set again
    # (LMDB refuses a second open of one environment in a process).
    del run
    gc.collect()
    return passes


def audit_recipe(recipe, root: str, samples: int, *, batch_size: int,
                 rank_counts: Sequence[int] = RANK_COUNTS,
                 worker_counts: Sequence[int] = WORKER_COUNTS) -> dict:
    """Every run of ``recipe`` over the probe set at ``root`` (see the module doc) and its
    metrics."""
    metrics: dict = {}
    for world_size in rank_counts:
        shares = run_ranks_epoch(recipe, root, world_size, batch_size=batch_size,
                                 workers=RANK_WORKERS)
        metrics.update(rank_metrics(world_size, shares, samples))
    # In a process of its own, before this one starts any loader thread (it forks).
    metrics.update(killed_worker_metrics(recipe, root, samples, batch_size=batch_size))
    reference = REFERENCE_WORKERS
    first, second, forgot = run_passes(recipe, root, batch_size=batch_size, workers=reference,
                                       limits=(None, COMPARED_SAMPLES), forget_set_epoch=True)
    (again,) = run_passes(recipe, root, batch_size=batch_size, workers=reference,
                          limits=(COMPARED_SAMPLES,))
    setting = f"workers{reference}"
    metrics.update(once_metrics(setting, first, samples))
    metrics[metric_name("randomness", "epochs", "same_draws")] = (
        same_draws(first.draws(), second.draws())[0], "ratio")
    metrics[metric_name("randomness", "epochs", "same_order")] = (
        same_order(first.labels[:len(second.labels)], second.labels), "ratio")
    metrics[metric_name("randomness", setting, "shared_draws")] = (
        shared_draws(list(first.draws().values())), "ratio")
    if forgot is not None:
        count = len(forgot.labels)
        metrics[metric_name("randomness", "no_set_epoch", "same_order")] = (
            same_order(second.labels[:count], forgot.labels[:count]), "ratio")
        metrics[metric_name("randomness", "no_set_epoch", "same_draws")] = (
            same_draws(second.draws(), forgot.draws())[0], "ratio")
    count = len(again.labels)
    metrics[metric_name("determinism", "same_workers", "same_order")] = (
        same_order(first.labels[:count], again.labels), "ratio")
    metrics[metric_name("determinism", "same_workers", "same_draws")] = (
        same_draws(first.draws(), again.draws())[0], "ratio")
    metrics["shuffle.storage_rank_correlation"] = (storage_rank_correlation(first.labels),
                                                   "ratio")
    metrics["shuffle.longest_stored_run"] = (longest_stored_run(first.labels), "count")
    if recipe.loader not in NO_WORKER_COUNT:
        for workers in worker_counts:
            if workers == reference or (recipe.loader in CORE_BOUND
                                        and workers > (os.cpu_count() or 1)):
                continue
            (other,) = run_passes(recipe, root, batch_size=batch_size, workers=workers,
                                  limits=(None,))
            setting = f"workers{workers}"
            metrics.update(once_metrics(setting, other, samples))
            metrics[metric_name("randomness", setting, "shared_draws")] = (
                shared_draws(list(other.draws().values())), "ratio")
            if workers == 1:
                metrics[metric_name("determinism", "other_workers", "same_order")] = (
                    same_order(first.labels, other.labels), "ratio")
                metrics[metric_name("determinism", "other_workers", "same_draws")] = (
                    same_draws(first.draws(), other.draws())[0], "ratio")
    return metrics


@contextlib.contextmanager
def probe_set(recipe, samples: int):
    with tempfile.TemporaryDirectory(prefix="storebench-correctness-") as scratch:
        yield build_probe_set(recipe, scratch, samples)


def _recipe(case: Case):
    from ...recipes import get_recipe

    recipe = get_recipe(str(case.param("recipe")))
    reason = recipe.unavailable()
    if reason:
        raise CaseSkipped(reason)
    return recipe


def counts(text) -> tuple[int, ...]:
    """``"1,2,4"`` (a case param) as ``(1, 2, 4)``; "" as none."""
    return tuple(int(part) for part in str(text or "").split(",") if part)


def audit_case(case: Case, trial: Trial) -> dict:
    """One recipe's audit (the module doc), over ``samples`` probes in a set of its own."""
    recipe = _recipe(case)
    samples = int(case.param("samples"))
    with probe_set(recipe, samples) as root:
        return audit_recipe(recipe, str(root), samples, batch_size=int(case.batch_size),
                            rank_counts=counts(case.param("rank_counts")),
                            worker_counts=counts(case.param("worker_counts")))
