"""The studies: a plain registry of functions that lay out a study's grid of cases.

``STUDIES[name](profile=..., data_dir=..., repeats=...) -> list[Case]``. ``data_dir`` holds the
profile's built datasets (``<data_dir>/<format>-<encoding>/``); each study's results go to
``results/<profile>/<study>.csv`` and feed one notebook.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .cache import CacheState
from .runner import DEFAULT_REPEATS, Case

StudyFunction = Callable[..., list[Case]]
CASES = "storebench.bench.cases"


def profile_datasets(profile: str, data_dir: Path | str) -> list[tuple[Path, dict]]:
    """(path, manifest) of every dataset under ``data_dir`` built from ``profile``'s specs,
    sorted by the formats registry's order, then encoding."""
    from data_gen import get_profile
    from storebench.formats import FORMATS, find_datasets, read_manifest

    specs = {spec.encoding: spec.to_dict() for spec in get_profile(profile).specs}
    found = []
    for path in find_datasets(data_dir):
        manifest = read_manifest(path)
        if manifest["spec"] == specs.get(manifest["spec"]["encoding"]):
            found.append((path, manifest))
    if not found:
        raise FileNotFoundError(
            f"{data_dir}: no datasets of profile {profile!r}; build them first "
            f"(storebench build --profile {profile})"
        )
    order = {name: i for i, name in enumerate(FORMATS)}
    encodings = ("raw", "png", "jpeg")
    found.sort(key=lambda item: (
        order.get(item[1]["format"], len(order)),
        encodings.index(item[1]["encoding"]) if item[1]["encoding"] in encodings else 99,
        str(item[0]),
    ))
    return found


def formats_study(
    *, profile: str, data_dir: Path | str, repeats: int = DEFAULT_REPEATS
) -> list[Case]:
    """Per built dataset: its build cost (from the manifest) and a full sequential read
    through the Reader, cold and warm."""
    from .cases import dataset_files

    cases = []
    for path, manifest in profile_datasets(profile, data_dir):
        common = {
            "study": "formats",
            "format": manifest["format"],
            "encoding": manifest["encoding"],
            "dataset": str(path),
        }
        if path.name != f"{manifest['format']}-{manifest['encoding']}":
            # A variant build (other knobs) gets its directory name into the case id.
            common["params"] = {"dataset_name": path.name}
        cases.append(Case(function=f"{CASES}:build_cost_case", repeats=1, warmup=False,
                          **common))
        files = dataset_files(path)
        for cache in CacheState:
            cases.append(Case(
                function=f"{CASES}:sequential_read_case", loader="reader",
                access="sequential", batch_size=256, cache=cache.value, cache_files=files,
                repeats=repeats, **common,
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


def lazy_vs_preloaded_study(
    *, profile: str, data_dir: Path | str, repeats: int = DEFAULT_REPEATS
) -> list[Case]:
    """Every dataset read lazily from storage vs preloaded into RAM, cold and warm, in
    block-shuffled order (the order every format can serve), decoded to arrays, one thread."""
    cases = []
    for path, manifest in profile_datasets(profile, data_dir):
        fields = _dataset_fields("lazy_vs_preloaded", path, manifest)
        decode = DECODE_FOR[manifest["encoding"]]
        for loader in ("lazy", "preloaded"):
            for cache in CacheState:
                cases.append(Case(
                    function=f"{CASES}:loader_epoch_case", loader=loader, prefetcher="none",
                    workers=0, batch_size=batch_size_for(manifest["num_samples"]),
                    access="block_shuffle", cache=cache.value, repeats=repeats,
                    params={"decode": decode} if decode else {}, **fields,
                ))
    return cases


PREFETCH_GRID = (
    ("none", 0, "fork"),
    ("thread", 1, "fork"),
    ("thread", 2, "fork"),
    ("process", 1, "fork"),
    ("process", 2, "fork"),
    ("process", 2, "spawn"),
    ("pickled_baseline", 2, "fork"),
    ("torch", 0, "fork"),
    ("torch", 2, "fork"),
)


def prefetch_study(
    *, profile: str, data_dir: Path | str, repeats: int = DEFAULT_REPEATS
) -> list[Case]:
    """Prefetchers and worker counts on a raw set (copy-bound) and a JPEG set (decode-bound),
    warm cache, shuffled."""
    datasets = profile_datasets(profile, data_dir)
    chosen = [
        _pick(datasets, "raw", ("memmap", "lmdb", "hdf5")),
        _pick(datasets, "jpeg", ("lmdb", "rawfiles", "hdf5")),
    ]
    cases = []
    for path, manifest in (c for c in chosen if c is not None):
        fields = _dataset_fields("prefetch", path, manifest)
        decode = DECODE_FOR[manifest["encoding"]]
        for prefetcher, workers, start_method in PREFETCH_GRID:
            params = {"start_method": start_method} if workers else {}
            if decode:
                params["decode"] = decode
            cases.append(Case(
                function=f"{CASES}:loader_epoch_case", loader="lazy", prefetcher=prefetcher,
                workers=workers, batch_size=batch_size_for(manifest["num_samples"]),
                access="shuffle", cache="warm", repeats=repeats, params=params, **fields,
            ))
    return cases


def gpu_feed_study(
    *, profile: str, data_dir: Path | str, repeats: int = DEFAULT_REPEATS,
    compute_ms: tuple[float, ...] = (0.0, 2.0, 10.0),
) -> list[Case]:
    """Feeding an (emulated) accelerator that spends ``compute_ms`` per batch, in-thread and
    with two prefetch processes; pinned and asynchronous copies only where CUDA is present
    (found without importing torch here)."""
    from .envinfo import cuda_info

    picked = _pick(profile_datasets(profile, data_dir), "raw", ("memmap", "lmdb", "hdf5"))
    if picked is None:
        raise FileNotFoundError(f"{data_dir}: gpu_feed needs a raw dataset")
    path, manifest = picked
    fields = _dataset_fields("gpu_feed", path, manifest)
    copies = [{}]
    if cuda_info()["torch_cuda_available"]:
        copies += [{"pinned": True}, {"pinned": True, "non_blocking": True}]
    cases = []
    for ms in compute_ms:
        for prefetcher, workers in (("none", 0), ("process", 2)):
            for copy in copies:
                params = {"compute_ms": ms, **copy}
                if workers:
                    params["start_method"] = "fork"
                cases.append(Case(
                    function=f"{CASES}:gpu_feed_case", loader="lazy", prefetcher=prefetcher,
                    workers=workers, batch_size=batch_size_for(manifest["num_samples"]),
                    access="shuffle", cache="warm", repeats=repeats, params=params, **fields,
                ))
    return cases


def targets_study(
    *, profile: str, data_dir: Path | str, repeats: int = DEFAULT_REPEATS
) -> list[Case]:
    """The loaders issue's performance targets, each measured with its comparison paths in
    the same call; a target whose dataset was not built is left out."""
    datasets = profile_datasets(profile, data_dir)
    plan = (
        ("batch_assembly", _pick(datasets, "raw", ("memmap",)), 256, {}),
        ("process_prefetch", _pick(datasets, "raw", ("memmap", "lmdb")), 256,
         {"start_method": "fork"}),
        ("thread_decode", _pick(datasets, "jpeg", ("lmdb", "hdf5", "rawfiles")), 64, {}),
        ("block_shuffle", _pick(datasets, "raw", ("parquet",)), 256, {}),
        ("tfrecord", _pick(datasets, "jpeg", ("tfrecord",)), 256, {"start_method": "fork"}),
    )
    required_format = {"batch_assembly": "memmap", "block_shuffle": "parquet",
                       "tfrecord": "tfrecord"}
    cases = []
    for target, picked, preferred_batch, params in plan:
        if picked is None:
            continue
        path, manifest = picked
        if target in required_format and manifest["format"] != required_format[target]:
            continue
        uses_workers = target in ("process_prefetch", "thread_decode", "tfrecord")
        cases.append(Case(
            function=f"{CASES}:target_case", loader=target, workers=2 if uses_workers else None,
            batch_size=batch_size_for(manifest["num_samples"], preferred_batch),
            access="shuffle", cache="warm", repeats=repeats,
            params={"target": target, **params},
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
