"""The studies: a plain registry of functions that lay out a study's grid of cases.

``STUDIES[name](profile=..., data_dir=..., repeats=None) -> list[Case]``. ``data_dir`` holds
the profile's built datasets (``<data_dir>/<format>-<encoding>/``, and the formats study's
knob variants ``<data_dir>/<format>-<encoding>-<knob>=<value>/``); each study's results go
to ``results/<profile>/<study>.csv`` and feed one notebook. ``repeats=None`` and the grid's
size come from the profile's ``plan.StudyPlan``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .cache import CacheState
from .plan import plan_for
from .runner import Case

StudyFunction = Callable[..., list[Case]]
CASES = "storebench.bench.cases"
ENCODING_ORDER = ("raw", "png", "jpeg")


@dataclass(frozen=True)
class KnobVariant:
    """A build of ``format`` x ``encoding`` with ``knobs`` other than the format's defaults,
    stored beside the default build as ``<format>-<encoding>-<knob>=<value>``."""

    format: str
    encoding: str
    knobs: tuple[tuple[str, object], ...]

    @property
    def name(self) -> str:
        knobs = ",".join(f"{k}={v}" for k, v in self.knobs)
        return f"{self.format}-{self.encoding}-{knobs}"


# What each format's build knobs change, measured against the default build (raw samples,
# where the format's unit of I/O matters most; plus JPEG for Parquet's codec).
KNOB_VARIANTS: tuple[KnobVariant, ...] = (
    KnobVariant("hdf5", "raw", (("chunk_samples", 1),)),
    KnobVariant("hdf5", "raw", (("chunk_samples", 1024),)),
    KnobVariant("parquet", "raw", (("row_group_size", 64),)),
    KnobVariant("parquet", "raw", (("row_group_size", 1024),)),
    KnobVariant("parquet", "raw", (("compression", "zstd"),)),
    KnobVariant("parquet", "jpeg", (("compression", "zstd"),)),
    KnobVariant("tfrecord", "raw", (("num_shards", 1),)),
    KnobVariant("tfrecord", "raw", (("num_shards", 16),)),
)


# Random batches read per repeat by the formats study: enough for a stable rate, bounded so
# that a large chunk or row group (read whole for every sample) does not take minutes.
RANDOM_READ_SAMPLES = 1024


def _repeats(profile: str, repeats: int | None) -> int:
    return plan_for(profile).repeats if repeats is None else repeats


def is_variant(path: Path, manifest: dict) -> bool:
    """Whether the build at ``path`` is a knob variant, not the default build."""
    return Path(path).name != f"{manifest['format']}-{manifest['encoding']}"


def profile_datasets(
    profile: str, data_dir: Path | str, *, variants: bool = False
) -> list[tuple[Path, dict]]:
    """(path, manifest) of every default build under ``data_dir`` made from ``profile``'s
    specs (and the knob variants too with ``variants=True``), sorted by the formats
    registry's order, then encoding, then directory name."""
    from data_gen import get_profile
    from storebench.formats import FORMATS, find_datasets, read_manifest

    specs = {spec.encoding: spec.to_dict() for spec in get_profile(profile).specs}
    found = []
    for path in find_datasets(data_dir):
        manifest = read_manifest(path)
        if manifest["spec"] == specs.get(manifest["spec"]["encoding"]) and (
                variants or not is_variant(path, manifest)):
            found.append((path, manifest))
    if not found:
        raise FileNotFoundError(
            f"{data_dir}: no datasets of profile {profile!r}; build them first "
            f"(storebench build --profile {profile})"
        )
    order = {name: i for i, name in enumerate(FORMATS)}
    found.sort(key=lambda item: (
        order.get(item[1]["format"], len(order)),
        ENCODING_ORDER.index(item[1]["encoding"]) if item[1]["encoding"] in ENCODING_ORDER
        else len(ENCODING_ORDER),
        is_variant(*item),
        str(item[0]),
    ))
    return found


def knob_params(path: Path, manifest: dict) -> dict:
    """A variant's directory name and the knobs where it differs from the default build, as
    case params (``knob_<name>``); nothing for a default build."""
    from storebench.formats import get_format

    if not is_variant(path, manifest):
        return {}
    defaults = get_format(manifest["format"]).DEFAULT_KNOBS
    return {"dataset_name": Path(path).name,
            **{f"knob_{name}": value for name, value in manifest["knobs"].items()
               if defaults.get(name) != value}}


def formats_study(
    *, profile: str, data_dir: Path | str, repeats: int | None = None
) -> list[Case]:
    """Per built dataset (knob variants included): its build cost (from the manifest) and a
    full sequential read through the Reader, cold and warm; for raw datasets also shuffled
    batches read through the Reader (what a chunk, row group or shard costs a random batch),
    cold (and warm on full plans)."""
    from .cases import dataset_files

    plan = plan_for(profile)
    repeats = _repeats(profile, repeats)
    cases = []
    for path, manifest in profile_datasets(profile, data_dir, variants=True):
        common = {
            "study": "formats",
            "format": manifest["format"],
            "encoding": manifest["encoding"],
            "dataset": str(path),
            "params": knob_params(path, manifest),
        }
        cases.append(Case(function=f"{CASES}:build_cost_case", repeats=1, warmup=False,
                          **common))
        files = dataset_files(path)
        for cache in CacheState:
            cases.append(Case(
                function=f"{CASES}:sequential_read_case", loader="reader",
                access="sequential", batch_size=256, cache=cache.value, cache_files=files,
                repeats=repeats, **common,
            ))
        if manifest["encoding"] != "raw":
            continue
        count = manifest["num_samples"]
        random_caches = (CacheState.COLD,) if plan.compact else tuple(CacheState)
        for cache in random_caches:
            cases.append(Case(
                function=f"{CASES}:random_read_case", loader="reader", access="shuffle",
                batch_size=batch_size_for(count, 64), cache=cache.value, cache_files=files,
                repeats=repeats,
                **{**common, "params": {**common["params"],
                                        "random_samples": min(count, RANDOM_READ_SAMPLES)}},
            ))
    return cases


# -- loader studies -------------------------------------------------------------------
DECODE_FOR = {"raw": None, "jpeg": "simplejpeg", "png": "pil"}


def batch_size_for(num_samples: int, preferred: int = 256) -> int:
    """``preferred``, or smaller for tiny (ci) sets so that an epoch has at least 8 batches
    (warm-up batches are discarded by the throughput functions)."""
    return max(8, min(preferred, num_samples // 8))


def _pick(datasets, encoding: str, preferred: tuple[str, ...]):
    """The first dataset of ``encoding`` in ``preferred`` format order, else any."""
    of_encoding = [(p, m) for p, m in datasets if m["encoding"] == encoding]
    for name in preferred:
        for path, manifest in of_encoding:
            if manifest["format"] == name:
                return path, manifest
    return of_encoding[0] if of_encoding else None


def _dataset_fields(study: str, path: Path, manifest: dict) -> dict:
    from .cases import dataset_files

    return {
        "study": study,
        "format": manifest["format"],
        "encoding": manifest["encoding"],
        "dataset": str(path),
        "cache_files": dataset_files(path),
    }


# Encoded (PNG/JPEG) sets of the lazy_vs_preloaded study on compact plans: one set of many
# small files and one single-file store stand for the rest (they decode the same bytes).
COMPACT_ENCODED_FORMATS = ("rawfiles", "lmdb")
# The readahead knobs of the memory-mapped formats: (format, open option), each tried on and
# off on a cold, shuffled epoch.
READAHEAD_KNOBS = (("memmap", "madvise_random"), ("lmdb", "readahead"))


def lazy_vs_preloaded_study(
    *, profile: str, data_dir: Path | str, repeats: int | None = None
) -> list[Case]:
    """Every dataset read lazily from storage vs preloaded into RAM, cold and warm, decoded
    to arrays, one thread. Raw sets in every access order (sequential, shuffled,
    block-shuffled; compact plans preload block-shuffled only, since a preload reads the
    files in one order whatever the epoch's order); encoded sets block-shuffled (compact
    plans: ``COMPACT_ENCODED_FORMATS`` only). Plus the readahead knobs of the memory-mapped
    formats (``READAHEAD_KNOBS``) on and off, lazy, cold, shuffled."""
    from .cases import ACCESS_ORDERS

    plan = plan_for(profile)
    repeats = _repeats(profile, repeats)
    cases = []
    for path, manifest in profile_datasets(profile, data_dir):
        raw = manifest["encoding"] == "raw"
        if not raw and plan.compact and manifest["format"] not in COMPACT_ENCODED_FORMATS:
            continue
        fields = _dataset_fields("lazy_vs_preloaded", path, manifest)
        decode = DECODE_FOR[manifest["encoding"]]
        batch_size = batch_size_for(manifest["num_samples"])
        for loader in ("lazy", "preloaded"):
            orders = ACCESS_ORDERS if raw and (loader == "lazy" or not plan.compact) else (
                "block_shuffle",)
            for access in orders:
                for cache in CacheState:
                    cases.append(Case(
                        function=f"{CASES}:loader_epoch_case", loader=loader,
                        prefetcher="none", workers=0, batch_size=batch_size, access=access,
                        cache=cache.value, repeats=repeats,
                        params={"decode": decode} if decode else {}, **fields,
                    ))
        for knob_format, option in READAHEAD_KNOBS:
            if manifest["format"] != knob_format or not raw:
                continue
            for on in (True, False):
                cases.append(Case(
                    function=f"{CASES}:loader_epoch_case", loader="lazy", prefetcher="none",
                    workers=0, batch_size=batch_size, access="shuffle", cache="cold",
                    repeats=repeats, params={f"open_{option}": on}, **fields,
                ))
    return cases


@dataclass(frozen=True)
class PrefetchVariant:
    """One prefetch path of the prefetch study's grid."""

    prefetcher: str
    workers: int | None
    start_method: str | None = None


WORKER_SWEEP = (1, 2, 4)  # 4 on a 2-core machine shows oversubscription


def prefetch_grid(*, sweep: tuple[int, ...] = WORKER_SWEEP) -> tuple[PrefetchVariant, ...]:
    """Every path the prefetch study compares: one thread, our thread and process
    prefetchers over ``sweep`` workers (and spawn), the two naive baselines, torch
    DataLoader in-process and with workers, and tf.data ``from_generator`` (GIL-bound)."""
    return (
        PrefetchVariant("none", 0),
        *(PrefetchVariant("thread", w) for w in sweep),
        *(PrefetchVariant("process", w, "fork") for w in sweep),
        PrefetchVariant("process", 2, "spawn"),
        PrefetchVariant("locked_list_baseline", 1),
        PrefetchVariant("pickled_baseline", 2, "fork"),
        PrefetchVariant("torch", 0),
        PrefetchVariant("torch", 2, "fork"),
        PrefetchVariant("tf_generator", None),
    )


# Compact plans: the full grid on the decode-bound set with the GIL-releasing decoder (the
# case the prefetchers exist for), and the two-worker core of it elsewhere.
COMPACT_CORE = (
    PrefetchVariant("none", 0),
    PrefetchVariant("thread", 2),
    PrefetchVariant("process", 2, "fork"),
)
COMPACT_RAW = (*COMPACT_CORE, PrefetchVariant("pickled_baseline", 2, "fork"),
               PrefetchVariant("torch", 2, "fork"))


def prefetch_study(
    *, profile: str, data_dir: Path | str, repeats: int | None = None
) -> list[Case]:
    """Prefetchers and worker counts, warm cache, shuffled: on a raw set (copy-bound) and a
    JPEG set (decode-bound) decoded by GIL-holding PIL and by GIL-releasing simplejpeg;
    plus tf.data's native TFRecord pipeline (AUTOTUNE, TensorFlow decoding) on the TFRecord
    JPEG set."""
    plan = plan_for(profile)
    repeats = _repeats(profile, repeats)
    datasets = profile_datasets(profile, data_dir)
    raw = _pick(datasets, "raw", ("memmap", "lmdb", "hdf5"))
    jpeg = _pick(datasets, "jpeg", ("lmdb", "rawfiles", "hdf5"))
    full = prefetch_grid()
    plans = []
    if raw is not None:
        plans.append((raw, None, COMPACT_RAW if plan.compact else full))
    if jpeg is not None:
        plans.append((jpeg, "simplejpeg", full))
        plans.append((jpeg, "pil", COMPACT_CORE if plan.compact else full))
    cases = []
    for (path, manifest), decode, grid in plans:
        fields = _dataset_fields("prefetch", path, manifest)
        for variant in grid:
            params = {"start_method": variant.start_method} if variant.start_method else {}
            if decode:
                params["decode"] = decode
            cases.append(Case(
                function=f"{CASES}:loader_epoch_case", loader="lazy",
                prefetcher=variant.prefetcher, workers=variant.workers,
                batch_size=batch_size_for(manifest["num_samples"]), access="shuffle",
                cache="warm", repeats=repeats, params=params, **fields,
            ))
    tfrecord = _pick(datasets, "jpeg", ("tfrecord",))
    if tfrecord is not None and tfrecord[1]["format"] == "tfrecord":
        path, manifest = tfrecord
        cases.append(Case(
            function=f"{CASES}:loader_epoch_case", loader="lazy", prefetcher="tf_data",
            batch_size=batch_size_for(manifest["num_samples"]), access="shuffle",
            cache="warm", repeats=repeats, params={"decode": "tf", "shuffle_buffer": 4096},
            **_dataset_fields("prefetch", path, manifest),
        ))
    return cases


def gpu_feed_study(
    *, profile: str, data_dir: Path | str, repeats: int | None = None,
    compute_ms: tuple[float, ...] = (0.0, 2.0, 10.0),
) -> list[Case]:
    """Feeding an accelerator that spends ``compute_ms`` per batch, in-thread and with two
    prefetch processes. The copies go to the first CUDA device where one is present (found
    without importing torch here), with pageable, pinned and asynchronous copies; else to
    the CPU, and every case's params say ``emulated=True``, ``device="cpu"``."""
    from .envinfo import cuda_info

    repeats = _repeats(profile, repeats)
    picked = _pick(profile_datasets(profile, data_dir), "raw", ("memmap", "lmdb", "hdf5"))
    if picked is None:
        raise FileNotFoundError(f"{data_dir}: gpu_feed needs a raw dataset")
    path, manifest = picked
    fields = _dataset_fields("gpu_feed", path, manifest)
    cuda = cuda_info()
    if cuda["torch_cuda_available"]:
        device = {"device": "cuda", "emulated": False,
                  "device_name": (cuda["devices"] or ["CUDA device"])[0]}
        copies = [{}, {"pinned": True}, {"pinned": True, "non_blocking": True}]
    else:
        device = {"device": "cpu", "emulated": True, "device_name": "cpu"}
        copies = [{}]
    cases = []
    for ms in compute_ms:
        for prefetcher, workers in (("none", 0), ("process", 2)):
            for copy in copies:
                params = {"compute_ms": ms, **device, **copy}
                if workers:
                    params["start_method"] = "fork"
                cases.append(Case(
                    function=f"{CASES}:gpu_feed_case", loader="lazy", prefetcher=prefetcher,
                    workers=workers, batch_size=batch_size_for(manifest["num_samples"]),
                    access="shuffle", cache="warm", repeats=repeats, params=params, **fields,
                ))
    return cases


# Which dataset each target kind measures: (encoding, preferred formats, required format).
TARGET_DATASETS = {
    "batch_assembly": ("raw", ("memmap",), "memmap"),
    "process_prefetch": ("raw", ("memmap", "lmdb"), None),
    "thread_decode": ("jpeg", ("lmdb", "hdf5", "rawfiles"), None),
    "block_shuffle": ("raw", ("parquet",), "parquet"),
    "tfrecord": ("jpeg", ("tfrecord",), "tfrecord"),
}
TARGET_BATCH = {"thread_decode": 64}
TARGET_PARAMS = {"process_prefetch": {"start_method": "fork"},
                 "tfrecord": {"start_method": "fork"}}
TARGET_WORKERS = ("process_prefetch", "thread_decode", "tfrecord")


def targets_study(
    *, profile: str, data_dir: Path | str, repeats: int | None = None
) -> list[Case]:
    """One case per performance target of ``bench.targets.TARGETS``, measuring its compared
    paths in the same call; a target whose dataset was not built is left out."""
    from .targets import TARGETS

    repeats = _repeats(profile, repeats)
    datasets = profile_datasets(profile, data_dir)
    cases = []
    for target in TARGETS:
        encoding, preferred, required = TARGET_DATASETS[target.kind]
        picked = _pick(datasets, encoding, preferred)
        if picked is None or (required and picked[1]["format"] != required):
            continue
        path, manifest = picked
        cases.append(Case(
            function=f"{CASES}:target_case", summarise="storebench.bench.targets:summarise_target",
            loader=target.key, workers=2 if target.kind in TARGET_WORKERS else None,
            batch_size=batch_size_for(manifest["num_samples"],
                                      TARGET_BATCH.get(target.kind, 256)),
            access="shuffle", cache="warm", repeats=repeats,
            params={"target": target.key, **TARGET_PARAMS.get(target.kind, {})},
            **_dataset_fields("targets", path, manifest),
        ))
    return cases


STUDIES: dict[str, StudyFunction] = {
    "formats": formats_study,
    "lazy_vs_preloaded": lazy_vs_preloaded_study,
    "prefetch": prefetch_study,
    "gpu_feed": gpu_feed_study,
    "targets": targets_study,
}


def get_study(name: str) -> StudyFunction:
    try:
        return STUDIES[name]
    except KeyError:
        raise KeyError(f"unknown study {name!r}; known studies: {sorted(STUDIES)}") from None
