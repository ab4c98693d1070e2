"""The prefetch study's grid: every loader path over the same shuffled epochs, on a raw set
and a JPEG set per decoder, our prefetchers swept over worker counts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...bench.case import Case
from ...bench.plan import plan_for
from ...loaders.paths import get_loader_path
from ..grid import (
    DECODERS_FOR,
    batch_size_for,
    dataset_fields,
    decode_params,
    encoded_pick,
    pick,
    profile_datasets,
    repeat_fields,
    steady_fields,
)

CASES = "storebench.studies.prefetch.cases"


@dataclass(frozen=True)
class PrefetchVariant:
    """One loader path of the prefetch study's grid: a ``LOADER_PATHS`` name, its workers
    and start method."""

    prefetcher: str
    workers: int | None
    start_method: str | None = None

    def __post_init__(self) -> None:
        get_loader_path(self.prefetcher)  # unknown names fail when the grid is laid out


WORKER_SWEEP = (1, 2, 4)  # 4 on a 2-core machine shows oversubscription


def prefetch_grid(*, sweep: tuple[int, ...] = WORKER_SWEEP) -> tuple[PrefetchVariant, ...]:
    """Every path the study compares: one thread, our thread and process prefetchers over
    ``sweep`` workers (and spawn), a thread prefetcher with one worker whose consumer reads
    too (two reading threads, as ThreadPrefetcher ×2 has), the two naive baselines, torch
    DataLoader in-process and with workers, and tf.data ``from_generator`` (GIL-bound)."""
    return (
        PrefetchVariant("none", 0),
        *(PrefetchVariant("thread", w) for w in sweep),
        PrefetchVariant("thread_consumer_reads", 1),
        *(PrefetchVariant("process", w, "fork") for w in sweep),
        PrefetchVariant("process", 2, "spawn"),
        PrefetchVariant("locked_list_baseline", 1),
        PrefetchVariant("pickled_baseline", 2, "fork"),
        PrefetchVariant("torch", 0),
        PrefetchVariant("torch", 2, "fork"),
        PrefetchVariant("tf_generator", None),
    )


# Compact plans: the full grid on the decode-bound set with simplejpeg (the
# case the prefetchers exist for), and the two-worker core of it elsewhere.
COMPACT_CORE = (
    PrefetchVariant("none", 0),
    PrefetchVariant("thread", 2),
    PrefetchVariant("process", 2, "fork"),
)
COMPACT_RAW = (*COMPACT_CORE, PrefetchVariant("pickled_baseline", 2, "fork"),
               PrefetchVariant("torch", 2, "fork"))


# The ImageNet-like set (``grid.is_training_set``), decode-bound at about 2 ms a sample: the
# worker sweep and the process start methods on simplejpeg, the two-worker
# core for PIL, for the reduced-size DCT decode (``decode="reduced"``) and for the
# crop-window decode (``decode="window"``), the copy-bound
# core on its raw copy (through the same crop). Left out there: the paths whose question
# the synthetic sets answer already (a consumer that reads too, the locked-list baseline,
# torch in-process: one thread again, tf.data from_generator: GIL-bound).
TRAINING_JPEG = (
    PrefetchVariant("none", 0),
    *(PrefetchVariant("thread", w) for w in WORKER_SWEEP),
    *(PrefetchVariant("process", w, "fork") for w in WORKER_SWEEP),
    PrefetchVariant("process", 2, "spawn"),
    PrefetchVariant("pickled_baseline", 2, "fork"),
    PrefetchVariant("torch", 2, "fork"),
)
TRAINING_DECODERS = ("simplejpeg", "pil", "reduced", "window")


def grid_plans(datasets, *, compact: bool) -> list:
    """((path, manifest), decoder or None, variants) per panel of the study: the raw set
    (copy-bound), then the encoded set with each of its decoders."""
    from ..grid import is_training_set

    raw = pick(datasets, "raw", ("memmap", "lmdb", "hdf5"))
    encoded = encoded_pick(datasets, ("lmdb", "rawfiles", "hdf5"))
    plans = []
    if raw is not None:
        plans.append((raw, None, COMPACT_RAW if compact or is_training_set(raw[1])
                      else prefetch_grid()))
    if encoded is not None and is_training_set(encoded[1]):
        first, *others = TRAINING_DECODERS
        plans.append((encoded, first, TRAINING_JPEG))
        plans += [(encoded, other, COMPACT_CORE) for other in others]
    elif encoded is not None:
        first, *others = DECODERS_FOR[encoded[1]["encoding"]]
        plans.append((encoded, first, prefetch_grid()))
        plans += [(encoded, other, COMPACT_CORE if compact else prefetch_grid())
                  for other in others]
    return plans


def loader_batch_size(manifest: dict) -> int:
    """256 samples (fewer on tiny sets); on the ImageNet-like set a per-GPU batch of 32
    (``grid.TRAINING_BATCH_SIZE``), as in the lazy_vs_preloaded study."""
    from ..grid import TRAINING_BATCH_SIZE, is_training_set

    preferred = TRAINING_BATCH_SIZE if is_training_set(manifest) else 256
    return batch_size_for(manifest["num_samples"], preferred)


# tf.data's shuffle buffer: 4096 samples; on the ImageNet-like set 1024, since the steady
# window opens only after the batches the buffer took in (``steady.read_ahead_batches``),
# each decoded: 4096 would cost about 4 s of decode per repeat before timing starts.
SHUFFLE_BUFFER = 4096
TRAINING_SHUFFLE_BUFFER = 1024


def shuffle_buffer(manifest: dict) -> int:
    from ..grid import is_training_set

    return TRAINING_SHUFFLE_BUFFER if is_training_set(manifest) else SHUFFLE_BUFFER


def grid(*, profile: str, data_dir: Path | str, repeats: int | None = None) -> list[Case]:
    """See the module docstring; on the ImageNet-like set, every row reads through the
    training transform (``grid.decode_params``): the raw copy's too."""
    plan = plan_for(profile)
    repeats = {**repeat_fields(profile, repeats), **steady_fields(profile)}
    datasets = profile_datasets(profile, data_dir)
    cases = []
    for (path, manifest), decode, variants in grid_plans(datasets, compact=plan.compact):
        fields = dataset_fields("prefetch", path, manifest)
        decoding = {k: v for k, v in decode_params(manifest).items() if v}
        for variant in variants:
            params = {"start_method": variant.start_method} if variant.start_method else {}
            params |= {**decoding, "decode": decode} if decode else decoding
            cases.append(Case(
                function=f"{CASES}:loader_epoch_case", loader="lazy",
                prefetcher=variant.prefetcher, workers=variant.workers,
                batch_size=loader_batch_size(manifest), access="shuffle",
                cache="warm", **repeats, params=params, **fields,
            ))
    tfrecord = encoded_pick(datasets, ("tfrecord",))
    if tfrecord is not None and tfrecord[1]["format"] == "tfrecord":
        path, manifest = tfrecord
        cases.append(Case(
            function=f"{CASES}:loader_epoch_case", loader="lazy", prefetcher="tf_data",
            batch_size=loader_batch_size(manifest), access="shuffle",
            cache="warm", **repeats,
            params={**decode_params(manifest), "decode": "tf",
                    "shuffle_buffer": shuffle_buffer(manifest)},
            **dataset_fields("prefetch", path, manifest),
        ))
    return cases
