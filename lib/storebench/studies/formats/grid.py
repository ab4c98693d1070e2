"""The formats study's grid: per built dataset (knob variants included), its build cost
and the reads ``read_plan`` gives it."""

from __future__ import annotations

from pathlib import Path

from ...bench.cache import CacheState
from ...bench.case import Case
from ...bench.plan import plan_for
from ...formats import traits
from ..grid import dataset_files, knob_params, profile_datasets, repeat_fields

CASES = "storebench.studies.formats.cases"


# Random batches read per repeat: enough for a stable rate, bounded so that a large chunk or
# row group (read whole for every sample) does not take minutes.
RANDOM_READ_SAMPLES = 1024
# ... and, warm, at most about this long (at least four batches): a row-group format pays
# its whole group per random sample, the same in every batch. Cold reads are not cut: a
# cold pass cut sooner is a colder one, and every format's must read the same samples.
RANDOM_READ_SECONDS = 0.5
# The ImageNet-like set's 150 KB raw samples: four batches of 64, since a random batch reads
# about one chunk or row group per sample (9.6 MB at 64 samples each, 38 MB at 256).
TRAINING_RANDOM_SAMPLES = 256
RANDOM_BATCH = 64
# The measures (``KNOB_EFFECTS`` columns) and the cases that take each.
KNOB_CASES = {"size_ratio": (), "random_cold": (("shuffle", "cold"),),
              "sequential_cold": (("sequential", "cold"),),
              "sequential_warm": (("sequential", "warm"),)}


def read_plan(path: Path, manifest: dict, *, compact: bool) -> tuple[tuple[str, str], ...]:
    """The (access, cache) read cases of one build. A default build: a sequential read cold
    and warm and, for raw arrays, random batches cold (and warm on full plans). A knob
    variant of the synthetic sets likewise; one of an ImageNet-like set only the read its
    knob is about (its format's ``knob_metrics``): each read of it is a 1.8 GB copy's.
    Random batches of an ImageNet-like set are read cold only: its knobs' measure."""
    from ...formats import get_format
    from ..grid import is_training_set, is_variant

    training = is_training_set(manifest)
    if training and is_variant(path, manifest):
        defaults = get_format(manifest["format"]).DEFAULT_KNOBS
        knobs = [k for k, v in manifest["knobs"].items() if defaults.get(k) != v]
        metrics = traits(manifest["format"]).knob_metrics
        return tuple(dict.fromkeys(case for knob in knobs
                                   for case in KNOB_CASES[metrics.get(knob, "sequential_warm")]))
    cases = [("sequential", cache.value) for cache in CacheState]
    if manifest["encoding"] == "raw":
        randoms = (CacheState.COLD,) if compact or training else tuple(CacheState)
        cases += [("shuffle", cache.value) for cache in randoms]
    return tuple(cases)


def built_for_family(path: Path, manifest: dict) -> bool:
    """Whether a build is one its family's grid reads: a default build, or a knob variant
    its format declares for that family (``KnobVariant.families``); an older build of a
    variant since dropped for the family is left out."""
    from ...formats import knob_variants
    from ..grid import is_training_set, is_variant

    if not is_variant(path, manifest):
        return True
    family = "imagenet" if is_training_set(manifest) else "synthetic"
    return Path(path).name in {v.name for v in knob_variants((manifest["format"],),
                                                             family=family)}


def grid(*, profile: str, data_dir: Path | str, repeats: int | None = None) -> list[Case]:
    """Per built dataset (knob variants included): build cost, then its reads
    (``read_plan``): a sequential read cold and warm, and for raw datasets shuffled
    batches, cold (and warm on full plans)."""
    from ..grid import batch_size_for, is_training_set

    plan = plan_for(profile)
    repeats = repeat_fields(profile, repeats)
    cases = []
    for path, manifest in profile_datasets(profile, data_dir, variants=True):
        if not built_for_family(path, manifest):
            continue
        common = {
            "study": "formats",
            "format": manifest["format"],
            "encoding": manifest["encoding"],
            "dataset": str(path),
            "params": knob_params(path, manifest),
        }
        cases.append(Case(function=f"{CASES}:build_cost_case", repeats=1, warmup=False,
                          measured_once=True, **common))
        files = dataset_files(path)
        count = manifest["num_samples"]
        wanted = TRAINING_RANDOM_SAMPLES if is_training_set(manifest) else RANDOM_READ_SAMPLES
        for access, cache in read_plan(path, manifest, compact=plan.compact):
            if access == "sequential":
                cases.append(Case(
                    function=f"{CASES}:sequential_read_case", loader="reader",
                    access="sequential", batch_size=256, cache=cache, cache_files=files,
                    **repeats, **common,
                ))
                continue
            cases.append(Case(
                function=f"{CASES}:random_read_case", loader="reader", access="shuffle",
                batch_size=batch_size_for(count, RANDOM_BATCH), cache=cache,
                cache_files=files, **repeats,
                **{**common, "params": {
                    **common["params"], "random_samples": min(count, wanted),
                    **({"random_seconds": RANDOM_READ_SECONDS} if cache == "warm" else {})}},
            ))
    return cases
