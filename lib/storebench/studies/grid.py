"""Helpers every study's grid uses: the profile's built datasets, batch sizes, case fields."""

from __future__ import annotations

from pathlib import Path

from ..bench.plan import plan_for
from ..text import ENCODING_ORDER

# The dataset directory of a format x encoding default build: ``<format>-<encoding>``; a
# knob variant's is ``<format>-<encoding>-<knob>=<value>``.


def repeats_for(profile: str, repeats: int | None) -> int:
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


def dataset_files(dataset: Path | str) -> tuple[str, ...]:
    """The data files of a built dataset, from its manifest (what cache control acts on)."""
    from storebench.formats import read_manifest

    root = Path(dataset)
    return tuple(str(root / name) for name in read_manifest(root)["files"])


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
DECODE_FOR = {"raw": None, "jpeg": "simplejpeg", "png": "pil"}
