"""How thoroughly each profile is measured: repeats, per-case timeout and grid size, in one
place.

The ``ci`` profile exists to exercise every code path of every study quickly (its datasets
are a few MB), so it gets fewer repeats and a grid trimmed where a dimension adds little
there (more formats of the same kind of case, more decoders under every prefetcher); every
*kind* of case still runs, so the notebooks draw every figure from it. Every other profile
gets the full grid.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from .stats import MIN_DECISION_REPEATS, AdaptiveRepeats

DEFAULT_REPEATS = 3
DEFAULT_TIMEOUT_S = 600.0
# Past their minimum, a case's repeats stop once another would take them past this: longer
# budgets bought intervals the guide did not need (``storebench.whatif`` replays a run under
# another budget; results/study-runs/README.md, "Constants and their evidence").
REPEAT_BUDGET_S = 1.5
# Samples each timed repeat of a loader epoch reads at most: half the default profile's
# JPEG and PNG sets, so an epoch of every set reads as many samples (8 batches of 256, 32
# of the peers' 64) and the 20,000-sample raw sets (whose cold epoch of 20,000 files was
# the study's costliest repeat) no longer dominate. Reading the first 2,048 of an epoch's
# order over the whole set keeps the access pattern: a shuffled read still lands anywhere
# in the files, a cold one still starts from an evicted, verified cache. Studies whose
# figure is the whole set (a preload, the formats study's full sequential read, epochs
# under a memory budget) read it whole.
EPOCH_SAMPLES = 2048

# The peers study reads whole epochs (a peer's loader stopped mid-epoch pays for its own
# stop), so its epochs are sized by its sets: the profile's raw and JPEG sets cut to
# EPOCH_SAMPLES (``peer_specs``), as many samples as every other study's epochs read, built
# apart under the data dir, here.
PEER_SETS_DIR = "peers"
IMAGENET_TRAIN_SAMPLES = 1_281_167
# What each timed repeat of a loader case times as its steady state, at least: batches after
# the loader's read-ahead, and seconds (``studies.steady``); a repeat shorter than a second
# times little more than its loader's start and a few batches.
STEADY_BATCHES = 20
STEADY_SECONDS = 1.0
# Case time a full study may spend, after every study has run, on more repeats of the two
# best candidates of questions still undecided (``storebench.topup``).
TOPUP_BUDGET_S = 180.0
# A case's first pass takes at least this many repeats; the top-up then takes the cases
# behind every guide question's two best candidates to ``MIN_DECISION_REPEATS``
# (``storebench.topup``), so repeats go to the candidates a question is decided between,
# not to the ones it is not close on.
SCREEN_REPEATS = 3


@dataclass(frozen=True)
class StudyPlan:
    """``repeats``: timed repeats per case where a fixed count is used; ``adaptive``: the
    rule most cases repeat by instead (at least ``SCREEN_REPEATS``, until the median's
    interval is narrow or the repeat budget is spent, at most 9), None for fixed counts;
    ``timeout_s``: how long one case may run; ``compact``: trim grid dimensions that only
    add more of the same kind of case; ``epoch_samples``: the most samples one timed repeat
    of a loader epoch reads (None: the whole set)."""

    repeats: int = DEFAULT_REPEATS
    adaptive: AdaptiveRepeats | None = AdaptiveRepeats(minimum=SCREEN_REPEATS,
                                                       budget_s=REPEAT_BUDGET_S)
    timeout_s: float = DEFAULT_TIMEOUT_S
    compact: bool = False
    epoch_samples: int | None = EPOCH_SAMPLES
    # Entries of the startup study's index: ImageNet-1k train's count; ci, a smaller index
    # that still pickles to megabytes as lists.
    index_entries: int = IMAGENET_TRAIN_SAMPLES
    # The least a loader case's steady window holds per repeat (``STEADY_BATCHES``,
    # ``STEADY_SECONDS``).
    steady_batches: int = STEADY_BATCHES
    steady_seconds: float = STEADY_SECONDS
    # Planned case seconds for top-up repeats (``storebench.topup``); 0: none.
    topup_budget_s: float = TOPUP_BUDGET_S
    # The repeats the top-up takes the cases behind each question's two best candidates to,
    # outside its budget (``storebench.topup``); None: no such floor.
    decision_repeats: int | None = MIN_DECISION_REPEATS

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.epoch_samples is not None and self.epoch_samples < 1:
            raise ValueError(f"epoch_samples must be positive, got {self.epoch_samples}")
        if self.steady_batches < 1 or not self.steady_seconds >= 0:
            raise ValueError(f"steady_batches must be positive and steady_seconds >= 0, got "
                             f"{self.steady_batches} and {self.steady_seconds}")
        if not self.topup_budget_s >= 0:
            raise ValueError(f"topup_budget_s must be >= 0, got {self.topup_budget_s}")
        if self.decision_repeats is not None and self.decision_repeats < 1:
            raise ValueError(f"decision_repeats must be positive, got {self.decision_repeats}")


# Profiles not named here get StudyPlan().
PLANS: dict[str, StudyPlan] = {
    # Fixed 3 repeats: ci exercises every path quickly, its numbers are not the reference.
    # Whole epochs: its sets (a few hundred samples) are smaller than any cap. A steady
    # window of a few batches and no minimum time: every path runs in seconds. A top-up
    # budget of one or two questions' planned case seconds (each under a second there), so
    # that a top-up round runs, and no floor of decision repeats.
    "ci": StudyPlan(repeats=3, adaptive=None, timeout_s=300.0, compact=True,
                    epoch_samples=None, index_entries=50_000, steady_batches=3,
                    steady_seconds=0.0, topup_budget_s=1.5, decision_repeats=None),
}


def plan_for(profile: str) -> StudyPlan:
    return PLANS.get(profile, StudyPlan())


def default_repeats(profile: str) -> int:
    return plan_for(profile).repeats


def case_timeout_s(profile: str) -> float:
    return plan_for(profile).timeout_s


# The peers study's cut of a training-set family (the ImageNet-like JPEGs and their 224x224
# raw copy): 20 batches of 64, so one whole later epoch holds the steady window's 20 batches
# and, decoding and cropping at under 1,000 images/s on two cores, lasts over a second.
PEER_TRAINING_SAMPLES = 1280


def peer_specs(profile: str, family: str = "synthetic") -> tuple:
    """(raw, JPEG) specs of the sets the peers study reads: the profile's raw and JPEG sets
    of ``family`` cut to one count, the smaller set's or ``EPOCH_SAMPLES``
    (``PEER_TRAINING_SAMPLES`` for a training-set family), whichever is less (their first
    samples: a sample depends only on its spec's seed and index, so they are the whole
    sets' bytes), so that an epoch of either reads as many samples."""
    import data_gen

    chosen = data_gen.get_profile(profile)
    specs = (chosen.spec_for("raw", family), chosen.spec_for("jpeg", family))
    cap = EPOCH_SAMPLES if family == "synthetic" else PEER_TRAINING_SAMPLES
    count = min(cap, *(spec.num_samples for spec in specs))
    return tuple(dataclasses.replace(spec, num_samples=count) for spec in specs)


def family_data_dir(data_dir: Path | str, family: str) -> Path:
    """Where a profile's sets of dataset ``family`` are built: the synthetic sets in
    ``data_dir`` itself, any other family in its own subdirectory (their format-encoding
    directory names would clash)."""
    return Path(data_dir) if family == "synthetic" else Path(data_dir) / family


def data_dir_family(data_dir: Path | str) -> str:
    """The dataset family whose sets ``data_dir`` holds: the inverse of
    ``family_data_dir``."""
    import data_gen

    name = Path(data_dir).name
    return name if name in data_gen.FAMILIES and name != "synthetic" else "synthetic"


def peer_sets_dir(data_dir: Path | str) -> Path:
    """Where the peers study's sets are: apart from the profile's other builds
    (``PEER_SETS_DIR``)."""
    return Path(data_dir) / PEER_SETS_DIR
