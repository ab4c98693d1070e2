"""Helpers every study's grid uses: the profile's built datasets, batch sizes, case fields."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..bench.plan import family_data_dir, peer_sets_dir, plan_for
from ..text import ENCODING_ORDER
from .shared_cases import dataset_files  # noqa: F401 - the grids' name for it

# The dataset directory of a format x encoding default build: ``<format>-<encoding>``; a
# knob variant's is ``<format>-<encoding>-<knob>=<value>``.


class StudyNotApplicableError(FileNotFoundError):
    """A study cannot run on these datasets: one it needs is not there (e.g. a raw copy of
    an import made without ``--resize``), or they are too small for its measurements."""


def repeats_for(profile: str, repeats: int | None) -> int:
    return plan_for(profile).repeats if repeats is None else repeats


def repeat_fields(profile: str, repeats: int | None, *,
                  budget_s: float | None | str = "plan",
                  threshold: float | None = None, minimum: int | None = None) -> dict:
    """The Case fields that set a case's repeats: exactly ``repeats`` when given (the CLI's
    ``--repeats``), else the plan's: adaptive (``stats.AdaptiveRepeats``) or a fixed count.
    ``budget_s`` replaces the rule's time budget (``"plan"``: keep it); None drops it, so
    repeats stop on the interval's width or the maximum only (the targets, whose verdict is
    the interval's lower end). ``threshold``: a target's, which an interval that contains it
    may not stop short of deciding (adaptive repeats only). ``minimum`` raises the rule's
    minimum: for cases the top-up cannot repeat (a target's, whose verdict needs
    ``MIN_DECISION_REPEATS`` from its first pass)."""
    plan = plan_for(profile)
    if repeats is not None or plan.adaptive is None:
        return {"repeats": repeats_for(profile, repeats)}
    rule = plan.adaptive
    return {"repeats": rule.maximum,
            "min_repeats": rule.minimum if minimum is None else max(minimum, rule.minimum),
            "stop_halfwidth": rule.halfwidth,
            "repeat_budget_s": rule.budget_s if budget_s == "plan" else budget_s,
            "stop_threshold": threshold}


def epoch_fields(profile: str) -> dict:
    """The Case fields that size a loader case's timed epochs: the plan's ``epoch_samples``
    (``bench.plan.EPOCH_SAMPLES``), for the studies whose figure is a loader's rate, not
    the whole set's, and its steady window (``steady_fields``)."""
    return {"epoch_samples": plan_for(profile).epoch_samples, **steady_fields(profile)}


def steady_fields(profile: str) -> dict:
    """The Case fields that size a loader case's steady window (``studies.steady``): the
    plan's ``steady_batches`` and ``steady_seconds``. Alone (no ``epoch_samples``), for
    the cases whose repeats read whole epochs until the window holds that much."""
    plan = plan_for(profile)
    return {"steady_batches": plan.steady_batches, "steady_seconds": plan.steady_seconds}


def is_variant(path: Path, manifest: dict) -> bool:
    """Whether the build at ``path`` is a knob variant, not the default build."""
    return Path(path).name != f"{manifest['format']}-{manifest['encoding']}"


def profile_datasets(
    profile: str, data_dir: Path | str, *, variants: bool = False, peers: bool = False,
    specs: Sequence | None = None,
) -> list[tuple[Path, dict]]:
    """(path, manifest) of every default build under ``data_dir`` made from ``profile``'s
    specs of any family (or ``specs``; the knob variants too with ``variants=True``; the
    peer formats' builds, and the peers study's own directory of sets, too with
    ``peers=True``), sorted by the formats registry's order, then encoding, then directory
    name."""
    from data_gen import FAMILIES, get_profile
    from storebench.formats import FORMATS, find_datasets, read_manifest
    from storebench.formats.specs import IMPORTED_KIND

    if specs is None:
        chosen = get_profile(profile)
        specs = [*chosen.specs, *chosen.imagenet]
    wanted = [spec.to_dict() for spec in specs]
    # The peers study's cut sets are its own: where a cut holds the whole set's count (a
    # small profile), they would otherwise be every other study's second copy of a set.
    # The other families' sets are apart too: a study reads one family.
    apart = [family_data_dir(data_dir, family) for family in FAMILIES if family != "synthetic"]
    apart += [] if peers else [Path(peer_sets_dir(data_dir))]
    everything = [(path, read_manifest(path)) for path in find_datasets(data_dir)
                  if not any(other in Path(path).parents for other in apart)]
    imported = [(p, m) for p, m in everything if m["spec"].get("kind") == IMPORTED_KIND]
    found = []
    # A directory of imported datasets (storebench import) is studied whatever the profile:
    # the profile then sizes the plan only.
    for path, manifest in imported or everything:
        if (imported or manifest["spec"] in wanted) and (
                variants or not is_variant(path, manifest)) and (
                peers or manifest["format"] in FORMATS.core):
            found.append((path, manifest))
    if not found:
        raise StudyNotApplicableError(
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


def batch_size_for(num_samples: int, preferred: int = 256) -> int:
    """``preferred``, or smaller for tiny (ci) sets so that an epoch has at least 8 batches
    (warm-up batches are discarded by the throughput functions)."""
    return max(8, min(preferred, num_samples // 8))


def pick(datasets, encoding: str, preferred: tuple[str, ...]):
    """The first dataset of ``encoding`` in ``preferred`` format order, else any."""
    of_encoding = [(p, m) for p, m in datasets if m["encoding"] == encoding]
    for name in preferred:
        for path, manifest in of_encoding:
            if manifest["format"] == name:
                return path, manifest
    return of_encoding[0] if of_encoding else None


def dataset_fields(study: str, path: Path, manifest: dict) -> dict:
    """The Case fields naming a dataset and the files its cache state applies to."""
    return {
        "study": study,
        "format": manifest["format"],
        "encoding": manifest["encoding"],
        "dataset": str(path),
        "cache_files": dataset_files(path),
    }


# The decoder each encoding's samples go through in the loader studies.
DECODE_FOR = {"raw": None, "jpeg": "simplejpeg", "png": "pil", "mixed": "auto"}
# Imported images of mixed sizes are resized to this in the worker before batching: the
# README's "resize to 224" pipeline.
STUDY_RESIZE = "224x224"


def is_imported_manifest(manifest: dict) -> bool:
    from storebench.formats.specs import IMPORTED_KIND

    return manifest["spec"].get("kind") == IMPORTED_KIND


def encoded_pick(datasets, preferred: tuple[str, ...]):
    """The encoded set the loader studies decode: the profile's JPEG set, or an import's
    encoded copy (JPEG, PNG or mixed), in ``preferred`` format order."""
    for encoding in ("jpeg", "mixed", "png"):
        found = pick(datasets, encoding, preferred)
        if found is not None and (encoding == "jpeg" or is_imported_manifest(found[1])):
            return found
    return None


# Decoders the prefetch study runs over each encoded set: a GIL-releasing one, then PIL.
DECODERS_FOR = {"jpeg": ("simplejpeg", "pil"), "mixed": ("auto", "pil"), "png": ("pil",)}


# The transform the ImageNet-like sets' samples go through in the loader studies: the
# standard training crop and flip (``loaders.RandomResizedCropFlip``), on the JPEGs and on
# their 224x224 raw copy alike, so that "store decoded or encoded?" differs by decode only.
TRAINING_TRANSFORM = "train"
# The loader studies' batch on the ImageNet-like set, where every sample is decoded and
# cropped (about 2 ms a JPEG on one core), so a repeat's steady window of 20 batches costs
# 20 x batch / rate seconds: a per-GPU batch of 32 (ResNet-50's 256 over eight GPUs).
TRAINING_BATCH_SIZE = 32


def is_training_set(manifest: dict) -> bool:
    """Whether the dataset is an ImageNet-like set (``data_gen.photo``), read as training
    reads it: through the standard training transform."""
    from storebench.formats.specs import PHOTO_KIND

    return manifest["spec"].get("kind") == PHOTO_KIND


def decode_params(manifest: dict) -> dict:
    """The case params that turn a dataset's stored samples into fixed-size arrays: its
    decoder; for an ImageNet-like set the training transform; for imported images of
    mixed sizes the resize."""
    from storebench.formats.specs import fixed_size, spec_from_dict

    params = {"decode": DECODE_FOR[manifest["encoding"]]}
    if is_training_set(manifest):
        params["transform"] = TRAINING_TRANSFORM
    elif not fixed_size(spec_from_dict(manifest["spec"])):
        params["resize"] = STUDY_RESIZE
    return params


def dataset_workload(manifest: dict, stored_kb: Sequence[float] | None = None) -> str:
    """The data a case over this build reads, in words: how many samples, of what, and
    their stored size (or the range ``stored_kb`` of several builds of it), e.g. "12,000
    ImageNet-like JPEGs of many sizes, 110-114 KB stored per sample"."""
    from storebench.formats.specs import fixed_size, is_imported, spec_from_dict

    spec = spec_from_dict(manifest["spec"])
    count = int(manifest["num_samples"])
    sizes = list(stored_kb or [float(manifest["bytes_apparent"]) / max(count, 1) / 1e3])
    stored = (f"{min(sizes):,.0f}" if f"{min(sizes):,.0f}" == f"{max(sizes):,.0f}"
              else f"{min(sizes):,.0f}\u2013{max(sizes):,.0f}")
    encoding = manifest["encoding"]
    kind = {"raw": "raw arrays", "mixed": "images (JPEG, PNG and others)"}.get(
        encoding, f"{encoding.upper()}s")
    if fixed_size(spec):
        height, width, channels = spec.image_shape
        kind = f"{height}x{width}x{channels} {kind}" if encoding == "raw" else (
            f"{height}x{width} {kind}")
    else:
        kind = f"{kind} of many sizes"
    if is_training_set(manifest):
        origin = ("ImageNet-like images pre-decoded as " if encoding == "raw"
                  else "ImageNet-like ")
    elif is_imported(spec):
        origin = "imported images as " if encoding == "raw" else "imported "
    else:
        origin = "synthetic "
    return f"{count:,} {origin}{kind}, {stored} KB stored per sample"


def cases_workloads(cases) -> dict[str, str]:
    """Encoding -> what ``cases`` read of it (``dataset_workload``: each set once, with the
    range of its builds' stored sizes) and how: the training transform or the resize where
    their params say so. Different sets of one encoding (cut and whole) are joined."""
    import json

    from storebench.formats import read_manifest

    seen: dict[str, dict] = {}
    manifests: dict[str, dict] = {}  # many cases read one build: its manifest once
    for case in cases:
        if not case.dataset or not (Path(case.dataset) / "manifest.json").is_file():
            continue
        if case.dataset not in manifests:
            manifests[case.dataset] = read_manifest(case.dataset)
        manifest = manifests[case.dataset]
        entry = seen.setdefault(manifest["encoding"], {"sets": {}, "how": set(),
                                                       "subsets": set()})
        key = json.dumps(manifest["spec"], sort_keys=True)
        first, sizes = entry["sets"].setdefault(key, (manifest, {}))
        sizes[str(case.dataset)] = (float(manifest["bytes_apparent"])
                                    / max(int(manifest["num_samples"]), 1) / 1e3)
        params = dict(case.params or {})
        if params.get("subset_samples"):  # a case reading its set's first n samples
            entry["subsets"].add(int(params["subset_samples"]))
        if params.get("transform") == TRAINING_TRANSFORM:
            entry["how"].add("the training crop (random resized crop to 224, flip)")
        elif params.get("resize"):
            entry["how"].add(f"a resize to {params['resize']}")
    return {encoding: " or ".join(
        dataset_workload(manifest, list(sizes.values()))
        for manifest, sizes in entry["sets"].values()) + (
        f"; read through {' or '.join(sorted(entry['how']))}" if entry["how"] else "") + (
        "; some cases read whole epochs of its first "
        f"{' or '.join(f'{n:,}' for n in sorted(entry['subsets']))} samples"
        if entry["subsets"] else "")
        for encoding, entry in seen.items()}
