"""The case data model: ``Case`` (one cell of a study's grid), ``Trial`` (what a case
function gets for one call), ``CaseResources``, ``CaseSkipped`` and ``CaseOutcome``.

A case function has the signature ``fn(case: Case, trial: Trial) -> {metric: (value, unit)}``
and wraps the part to be timed in ``with trial.measure():``; wall time, CPU time and peak
PSS/USS of that region are added to its metrics. ``storebench.bench.runner`` runs cases.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from .cache import CacheState
from .plan import DEFAULT_REPEATS
from .schema import CASE_REPEAT

_SCALARS = (str, int, float, bool, type(None))

@dataclass(frozen=True)
class Case:
    """One cell of a study's grid. Fields that do not apply stay empty (``""`` / ``None``).

    ``params`` holds case-specific knobs as sorted ``(name, value)`` pairs of JSON scalars;
    a dict is accepted and converted. ``cache_files`` are the files whose page-cache state
    ``cache`` controls and whose residency every row records.
    """

    study: str
    function: str
    format: str = ""
    encoding: str = ""
    dataset: str = ""
    loader: str = ""
    prefetcher: str = ""
    workers: int | None = None
    batch_size: int | None = None
    access: str = ""
    cache: str = ""
    cache_files: tuple[str, ...] = ()
    repeats: int = DEFAULT_REPEATS
    # Adaptive repeats when set: at least this many, then ``stats.AdaptiveRepeats`` decides,
    # ``repeats`` being the most; None: exactly ``repeats``.
    min_repeats: int | None = None
    stop_halfwidth: float = 0.05
    # Adaptive repeats only: stop early once another repeat would pass this many seconds.
    repeat_budget_s: float | None = None
    # Adaptive repeats only: a target's threshold, which an undecided interval must not
    # stop short of deciding (``stats.AdaptiveRepeats.threshold``).
    stop_threshold: float | None = None
    warmup: bool = True
    timeout_s: float | None = None
    params: tuple[tuple[str, object], ...] = ()
    summarise: str = ""
    # The case reports a quantity measured once elsewhere (a build's time, from its
    # manifest) or exact counts of one seeded run (an audit's deliveries): it runs one
    # repeat, and nothing repeats it, since a repeat would copy the value.
    measured_once: bool = False
    # The most samples a timed repeat of a loader epoch reads (the first of the epoch's
    # order); None: the whole set. Not part of ``case_id``: it sizes the measurement, like
    # ``repeats``, and is recorded in the case's rows (``epoch_samples_cap``).
    epoch_samples: int | None = None
    # What a loader case's steady window must hold before a repeat may stop: batches after
    # the loader's read-ahead, and seconds (``studies.steady``). Not part of ``case_id``:
    # they size the measurement, from the plan.
    steady_batches: int = 1
    steady_seconds: float = 0.0

    def __post_init__(self) -> None:
        for role, path in (("function", self.function), ("summarise", self.summarise)):
            if (path or role == "function") and ":" not in path:
                raise ValueError(f"case {role} must be 'module.path:function', got {path!r}")
        params = self.params
        if isinstance(params, Mapping):
            params = params.items()
        params = tuple(sorted((str(k), v) for k, v in params))
        for name, value in params:
            if not isinstance(value, _SCALARS):
                raise TypeError(
                    f"case param {name!r} must be a JSON scalar (str, int, float, bool, None), "
                    f"got {type(value).__name__}"
                )
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "cache_files", tuple(str(p) for p in self.cache_files))
        if self.cache:
            CacheState(self.cache)  # raises ValueError for anything but cold/warm
            if not self.cache_files:
                raise ValueError(f"case {self.case_id}: cache={self.cache!r} needs cache_files")
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        if self.measured_once and (self.repeats != 1 or self.min_repeats is not None):
            raise ValueError(f"case {self.case_id}: a quantity measured once is one repeat, "
                             f"got repeats={self.repeats}, min_repeats={self.min_repeats}")
        if self.min_repeats is not None:
            self.adaptive_repeats  # noqa: B018 - validates minimum <= maximum, halfwidth
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.epoch_samples is not None and self.epoch_samples < 1:
            raise ValueError(f"epoch_samples must be positive, got {self.epoch_samples}")
        if self.steady_batches < 1 or not self.steady_seconds >= 0:
            raise ValueError(f"steady_batches must be positive and steady_seconds >= 0, got "
                             f"{self.steady_batches} and {self.steady_seconds}")

    @property
    def adaptive_repeats(self):
        """The case's ``stats.AdaptiveRepeats``, or None for a fixed repeat count."""
        if self.min_repeats is None:
            return None
        from .stats import AdaptiveRepeats

        return AdaptiveRepeats(self.min_repeats, self.repeats, self.stop_halfwidth,
                               self.repeat_budget_s, self.stop_threshold)

    @property
    def case_id(self) -> str:
        """Readable and unique within a study: what is measured (the case function's name),
        then the non-empty grid coordinates and the params."""
        measured = self.function.rpartition(":")[2].removesuffix("_case")
        dataset = "-".join(p for p in (self.format, self.encoding) if p)
        parts = [
            dataset,
            self.loader,
            self.prefetcher,
            "" if self.workers is None else f"w{self.workers}",
            "" if self.batch_size is None else f"b{self.batch_size}",
            self.access,
            self.cache,
            *(f"{name}={value}" for name, value in self.params),
        ]
        return ":".join([measured, "/".join(p for p in parts if p)]).rstrip(":")

    def param(self, name: str, default=None):
        return dict(self.params).get(name, default)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["params"] = dict(self.params)
        data["cache_files"] = list(self.cache_files)
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> Case:
        data = dict(data)
        data["cache_files"] = tuple(data.get("cache_files", ()))
        return cls(**data)


# Two batches: each of the default two workers reads one, so every thread or process has
# imported and allocated what its repeats will; a repeat makes its own loader anyway.
WARMUP_BATCHES = 2


class CaseResources:
    """What a case's trials share in its process (``Trial.kept``): each made once, on first
    use, and closed, last made first, when the case's last trial has run."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._made: dict = {}

    def get(self, key, make):
        if key not in self._made:
            self._made[key] = self._stack.enter_context(make())
        return self._made[key]

    def close(self) -> None:
        self._made.clear()
        self._stack.close()

    def __enter__(self) -> CaseResources:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Trial:
    """What a case function gets for one call: which repeat it is, ``measure()`` and
    ``kept()``.

    ``repeat`` is -1 for the untimed warm-up. ``resident_fraction`` is the dataset's residency
    measured just before this call (NaN without cache control).
    """

    def __init__(self, case: Case, repeat: int, *, resident_fraction: float = math.nan,
                 resources: CaseResources | None = None) -> None:
        self.case = case
        self.repeat = repeat
        self.resident_fraction = resident_fraction
        self._measurement = None
        self._resources = resources

    @contextlib.contextmanager
    def kept(self, key, make):
        """``with trial.kept(key, make) as thing:`` the context manager ``make()`` returns,
        entered by the first trial of the case's process that asks for ``key`` and reused by
        its later trials, exited after the case's last trial (a service a case talks to, such
        as a delaying proxy: nothing the timed region measures may carry over in it). A Trial
        made without the worker's ``CaseResources`` (a test, a notebook) enters and exits it
        around the block."""
        if self._resources is None:
            with make() as thing:
                yield thing
            return
        yield self._resources.get(key, make)

    @property
    def warmup(self) -> bool:
        return self.repeat == CASE_REPEAT

    def batches_wanted(self, max_batches: int | None, *, samples: int | None = None,
                       ranks: int = 1) -> int | None:
        """How many batches this call should read (each of ``ranks`` ranks, for a set of
        ``samples`` samples): ``WARMUP_BATCHES`` in the warm-up (it exists to import,
        allocate and start threads, not to read an epoch: the cache state of each timed
        repeat is set by the harness), else ``max_batches``, at most the batches of the
        case's ``epoch_samples`` where that is less than the set (``samples``; unknown:
        the cap applies). None: the whole epoch."""
        if self.warmup:
            return WARMUP_BATCHES if max_batches is None else min(max_batches, WARMUP_BATCHES)
        cap = self.case.epoch_samples
        if cap is None or (samples is not None and cap >= samples):
            return max_batches
        capped = max(1, -(-cap // ((self.case.batch_size or 256) * ranks)))
        return capped if max_batches is None else min(max_batches, capped)

    def measure(self, *, interval: float = 0.05):
        """Context manager timing the region it wraps (once per trial)."""
        from .metrics import RegionMeasurement

        if self._measurement is not None:
            raise RuntimeError(f"case {self.case.case_id}: trial.measure() used twice")
        self._measurement = RegionMeasurement(interval=interval)
        return self._measurement

    def harness_metrics(self) -> dict[str, tuple[float, str]]:
        if self._measurement is None:
            return {}
        return self._measurement.metrics()


class CaseSkipped(Exception):  # noqa: N818 - a verdict, not an error
    """Raised by a case function that cannot measure on this machine (no memory cgroup for
    a budget, say): the case becomes one row with status ``skipped`` and ``reason`` as its
    error, instead of a measurement taken under other conditions than the case says."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class CaseOutcome:
    """What the worker reported: per-repeat metric records, or why there are none."""

    status: str
    seconds: float
    records: tuple[dict, ...] = ()
    error: str = ""


def open_options(params) -> dict:
    """The format open options a case chose: its params ``open_<option>`` as ``<option>``.
    ``params`` is a ``Case``, its params (pairs or a mapping) or a result row's JSON text."""
    if isinstance(params, Case):
        params = params.params
    elif isinstance(params, str):
        params = json.loads(params)
    items = params.items() if isinstance(params, Mapping) else params
    return {name.removeprefix("open_"): value for name, value in items
            if name.startswith("open_")}
