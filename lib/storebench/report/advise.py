"""``storebench advise``: a user's situation answered from measured rows plus the capacity
model.

The format, the loader and the decoder are the decision guide's choices
(``storebench.guide``, ``results.TIE_RULE``) for the rows that match the situation (their
``GuideRow.facets``): image kind, where the data lives (in RAM, larger than RAM, at a round
trip) and how far it outgrows RAM. Nothing here names a winner. The rates are the measured
medians of those choices on the machine in ``env.json``; what the user's machine would reach
is extrapolated from them under the assumptions each answer lists (a rate per core that
scales with cores and with the bytes a sample holds, the reference disk's bandwidth, the
capacity model's round trips).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..results import DECISION_MARGIN
from ..text import ENCODING_NAMES, GUEST_COLD, format_percent, format_value

IMAGE_KINDS = ("jpeg", "png", "raw")
# The training crop's resize filter classes (``recipes.base``): recipes are compared within
# one; antialiased is torchvision's and Pillow's, plain is ``tf.image.resize``'s default.
RESIZE_FILTERS = ("antialiased", "plain")
STORAGES = ("local", "nfs", "s3")
# Local disk kinds, as ``--disk`` names them and as the results' env.json implies them: a
# disk's bandwidth and queue depth are its own, so one kind's rows never answer for another.
DISK_NAMES = {"virtio": "a virtio disk", "nvme": "an NVMe SSD", "ssd": "a SATA/SAS SSD",
              "hdd": "a spinning disk"}
DISK_KINDS = tuple(DISK_NAMES)
# MLPerf Storage's rule: a run is valid while the accelerators are at least 90% busy.
BUSY_TARGET = 0.90
# "Busy: yes" needs a feed at least this many times the demand: the gpu_feed study's
# evidence is of paths that deliver 1.25x the accelerator's rate and more (all of them 95%
# busy and more). From BUSY_TARGET up to this, the answer is "marginal".
BUSY_HEADROOM = 1.25
# How far advise extrapolates from what was measured, and no farther: round trips up to
# this many times the farthest measured, and samples within this factor of the measured
# set's mean stored bytes, either way.
MAX_RTT_FACTOR = 2.0
MAX_BYTES_FACTOR = 4.0
# A set counts as fitting in RAM while it takes at most this share of it: the rest is the
# training process's, its decoded batches' and the kernel's.
FIT_FRACTION = 0.5
# The kind named as the nearest measured where a kind was not measured: its rates are never
# turned into another encoding's (a PNG decodes at a different cost per byte than a JPEG).
NEAREST_KIND = {"png": ("jpeg",), "jpeg": ("png",), "raw": ()}


class AdviceError(ValueError):
    """A situation or a results directory that advise cannot answer; one line."""


class NotMeasuredError(AdviceError):
    """A situation farther from what was measured than advise extrapolates: it names the
    nearest measured, and ``advise`` adds how to measure the user's own."""


@dataclass(frozen=True)
class Workload:
    """A named accelerator demand: samples/s per accelerator, with where the number is
    from."""

    name: str
    samples_per_s: float
    images: str
    mean_bytes: float
    source: str


WORKLOADS: dict[str, Workload] = {
    w.name: w for w in (
        Workload("mlperf-resnet50-h100", 1786.0, "jpeg", 114.7e3,
                 "MLPerf Storage v1 ResNet-50 on an emulated H100: batch 400 in 0.224 s "
                 "(mlcommons/storage, workload configs and rules)"),
    )
}


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise AdviceError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    return WORKLOADS[name]


@dataclass(frozen=True, kw_only=True)
class Situation:
    """What the user has: ``images`` of one kind, ``count`` of them of ``mean_bytes`` each,
    stored on ``storage`` (``rtt_ms`` away for nfs and s3); per node ``ram_gb`` of RAM,
    ``cores`` and ``accelerators``; ``nodes`` nodes; each accelerator needing ``demand``
    samples/s."""

    images: str
    count: int
    mean_bytes: float
    storage: str = "local"
    rtt_ms: float | None = None
    # The local disk's kind (``DISK_KINDS``); None where not given: the reference's is
    # assumed, and the answer says so.
    disk: str | None = None
    ram_gb: float
    cores: int
    accelerators: int = 1
    nodes: int = 1
    demand: float
    workload: str | None = None
    # The resize filter the user's training crop uses (``RESIZE_FILTERS``).
    resize: str = "antialiased"

    def __post_init__(self) -> None:
        if self.resize not in RESIZE_FILTERS:
            raise AdviceError(f"--resize must be one of {', '.join(RESIZE_FILTERS)}, "
                              f"got {self.resize!r}")
        if self.images not in IMAGE_KINDS:
            raise AdviceError(f"--images must be one of {', '.join(IMAGE_KINDS)}, "
                              f"got {self.images!r}")
        if self.storage not in STORAGES:
            raise AdviceError(f"--storage must be one of {', '.join(STORAGES)}, "
                              f"got {self.storage!r}")
        for flag, value in (("--count", self.count), ("--mean-bytes", self.mean_bytes),
                            ("--ram-gb", self.ram_gb), ("--cores", self.cores),
                            ("--accelerators", self.accelerators), ("--nodes", self.nodes),
                            ("--demand", self.demand)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise AdviceError(f"{flag} must be a positive number, got {value!r}")
        for flag, value in (("--count", self.count), ("--cores", self.cores),
                            ("--accelerators", self.accelerators), ("--nodes", self.nodes)):
            if value != int(value):
                raise AdviceError(f"{flag} must be a whole number, got {value!r}")
        if self.disk is not None:
            if self.disk not in DISK_KINDS:
                raise AdviceError(f"--disk must be one of {', '.join(DISK_KINDS)}, "
                                  f"got {self.disk!r}")
            if self.storage != "local":
                raise AdviceError("--disk applies to --storage local, not to "
                                  f"{self.storage}")
        if self.storage == "local" and self.rtt_ms is not None:
            raise AdviceError("--rtt-ms applies to --storage nfs or s3, not to local disk")
        if self.storage != "local":
            if self.rtt_ms is None:
                raise AdviceError(f"--storage {self.storage} needs --rtt-ms (the round trip "
                                  "to the storage, e.g. 1 within a data centre)")
            if not (math.isfinite(self.rtt_ms) and self.rtt_ms >= 0):
                raise AdviceError(f"--rtt-ms must be zero or more, got {self.rtt_ms!r}")

    @property
    def dataset_bytes(self) -> float:
        return self.count * self.mean_bytes

    @property
    def ram_ratio(self) -> float:
        """How many times the set is larger than the node's RAM."""
        return self.dataset_bytes / (self.ram_gb * 1e9)

    @property
    def fits_in_ram(self) -> bool:
        return self.ram_ratio <= FIT_FRACTION

    @property
    def cores_per_accelerator(self) -> float:
        return self.cores / self.accelerators

    def to_dict(self) -> dict:
        return {"images": self.images, "count": self.count, "mean_bytes": self.mean_bytes,
                "dataset_bytes": self.dataset_bytes, "storage": self.storage,
                "rtt_ms": self.rtt_ms, "disk": self.disk, "ram_gb": self.ram_gb,
                "fits_in_ram": self.fits_in_ram,
                "ram_ratio": self.ram_ratio, "cores": self.cores,
                "accelerators": self.accelerators, "nodes": self.nodes,
                "demand_samples_per_s": self.demand, "workload": self.workload,
                "resize": self.resize}

    def text(self) -> str:
        disk = "disk" if self.disk is None else DISK_NAMES[self.disk].split(" ", 1)[1]
        where = (f"on local {disk}" if self.storage == "local" else
                 f"on a network file system {self.rtt_ms:g} ms away" if self.storage == "nfs"
                 else f"in object storage {self.rtt_ms:g} ms away")
        ram = ("fits in RAM" if self.fits_in_ram else
               f"{self.ram_ratio:.2g}\u00d7 the RAM")
        demand = format_value(self.demand, "samples/s") + (
            f" ({self.workload})" if self.workload else "")
        return (f"{self.count:,} {ENCODING_NAMES[self.images]} samples of "
                f"{format_value(self.mean_bytes, 'bytes')} "
                f"({format_value(self.dataset_bytes, 'bytes')}) {where}; "
                f"{self.ram_gb:g} GB RAM ({ram}), {self.cores} cores and "
                f"{self.accelerators} accelerator(s) per node, {self.nodes} node(s); "
                f"{demand} per accelerator"
                + ("; the training crop resizes plain (no antialiasing)"
                   if self.resize == "plain" else ""))


def dataset_situation(path: Path | str) -> dict:
    """``images``, ``count`` and ``mean_bytes`` of a directory written by ``storebench
    import``: from its encoded set's manifest (the raw set where only that was imported)."""
    from ..formats import find_datasets, read_manifest
    from ..formats.specs import IMPORTED_KIND

    root = Path(path)
    if not root.is_dir():
        raise AdviceError(f"{root}: no such directory (write one with storebench import SRC "
                          f"--out {root})")
    specs = [read_manifest(p)["spec"] for p in find_datasets(root)]
    specs = [s for s in specs if s.get("kind") == IMPORTED_KIND]
    if not specs:
        raise AdviceError(f"{root}: holds no imported dataset; write one with storebench "
                          f"import SRC --out {root}")
    spec = min(specs, key=lambda s: s["encoding"] == "raw")  # the encoded set first
    if spec["encoding"] not in IMAGE_KINDS:
        raise AdviceError(f"{root}: its images are {spec['encoding']} (JPEG and PNG mixed); "
                          "give --images, or import one kind")
    return {"images": spec["encoding"], "count": int(spec["num_samples"]),
            "mean_bytes": spec["stored_bytes"] / spec["num_samples"]}


@dataclass(frozen=True)
class Choice:
    """A guide row's answer: the best candidate (its key, label, median and unit), those
    tied with it, and the row's question and verdict."""

    study: str
    question: str
    key: str
    label: str
    median: float
    unit: str
    tied: tuple[str, ...]
    undecided: bool
    runner_up: str | None
    facets: Mapping = field(default_factory=dict)
    # The slowest candidate measured for the same question, and its median.
    worst: str | None = None
    worst_median: float = math.nan
    # Why the guide could not decide (``GuideRow.undecided_reason``); empty where it did.
    undecided_reason: str = ""
    # (study, case_id, metric) of the result rows behind the best and the runner-up: the
    # cases a quick study measures again to decide the same question (``report.quick``).
    evidence: tuple[tuple[str, str, str], ...] = ()
    # The runner-up's key and median (None and NaN where the row has one candidate).
    runner_up_key: str | None = None
    runner_up_median: float = math.nan

    @classmethod
    def of(cls, row) -> Choice:
        second, last = row.runner_up, row.candidates[-1]
        evidence = tuple(dict.fromkeys(
            source for candidate in row.candidates[:2]
            for source in (candidate.stat.sources or candidate.stat.derived_from)))
        return cls(row.study, row.question, row.best.key, row.best.label, row.best.stat.median,
                   row.best.stat.unit, tuple(row.tied) if row.tie and not row.undecided else (),
                   row.undecided, second.label if second else None, dict(row.facets),
                   last.label if second else None, last.stat.median if second else math.nan,
                   row.undecided_reason if row.undecided else "", evidence,
                   second.key if second else None,
                   second.stat.median if second else math.nan)

    @property
    def avoid(self) -> str | None:
        """The slowest candidate against the best, where one is several times slower."""
        if self.worst is None or self.unit != "samples/s" or not self.worst_median > 0:
            return None
        times = self.median / self.worst_median
        if times < 2:
            return None
        return (f"avoid {self.worst}: {format_value(self.worst_median, self.unit)}, "
                f"{times:.0f}\u00d7 slower than {self.label} in the same rows")

    @property
    def text(self) -> str:
        if self.tied:
            return (f"any of {', '.join((self.label, *self.tied))} (equivalent within "
                    f"{DECISION_MARGIN:.0%})")
        if self.undecided:
            return (f"{self.label} (measured best, but undecided against {self.runner_up}: "
                    f"{self.undecided_reason})")
        return self.label

    def to_dict(self) -> dict:
        return {"choice": self.text, "best": self.key, "label": self.label,
                "median": self.median, "unit": self.unit, "tied_with_best": list(self.tied),
                "undecided": self.undecided, "study": self.study, "question": self.question,
                "facets": dict(self.facets), "worst": self.worst,
                "worst_median": self.worst_median}


# A figure timed on this machine by ``advise --measure``, in place of the reference's.
MEASURED_HERE = "measured here"


@dataclass(frozen=True)
class Number:
    """One figure of the answer: ``measured`` on the reference machine, ``measured here``
    (by ``advise --measure``; ``reference`` is the reference's value of the same figure),
    ``extrapolated`` from measured ones (``basis`` says how) or ``cited``."""

    what: str
    value: float
    unit: str
    kind: str
    basis: str
    reference: float | None = None

    def to_dict(self) -> dict:
        return {"what": self.what, "value": self.value, "unit": self.unit, "kind": self.kind,
                "basis": self.basis, "measured_here": self.kind == MEASURED_HERE,
                "reference_value": self.reference}

    def text(self) -> str:
        value = format_value(self.value, self.unit)
        beside = ("" if self.reference is None else
                  f"; the reference: {format_value(self.reference, self.unit)}")
        return f"{self.kind:13} {value:>18}  {self.what} ({self.basis}{beside})"


@dataclass(frozen=True)
class Anchor:
    """A published rate (samples/s) from another machine, cited beside ours: ``low`` to
    ``high`` where the source gives a range."""

    name: str
    what: str
    low: float
    high: float
    source: str

    @property
    def range_text(self) -> str:
        return (f"{self.low:,.0f}" if self.low == self.high
                else f"{self.low:,.0f}-{self.high:,.0f}")

    def number(self) -> Number:
        return Number(f"{self.name}: {self.what}", self.low, "samples/s", "cited",
                      f"{self.range_text}/s; {self.source}")


# Public figures (the anchors) a comparison or a remedy cites where our rows measured
# nothing like them; always marked "cited".
GPU_DECODE_ANCHOR = Anchor(
    "GPU decode", "JPEG decode on one A100 with DALI's mixed decoder", 5000.0, 7000.0,
    "about 5,000 with the hardware decoder alone; NVIDIA/DALI#5362")
CROP_DECODE_ANCHOR = Anchor(
    "crop-window decode", "decode and random resized crop per thread, images pre-resized to "
    "256-512 px", 727.0, 1077.0, "harvard-visionlab/slipstream")
# Whole JPEG training pipelines per core on ImageNet-size images, shown beside our rate.
PER_CORE_ANCHORS = (
    Anchor("tuned DataLoader", "torch DataLoader tuned, full-size ImageNet, per allocated CPU",
           359.0, 359.0, "mghpcc aicr-benchmarks, B200 node"),
    Anchor("FFCV", "FFCV, per vCPU", 326.0, 326.0, "FFCV paper and repo"),
    CROP_DECODE_ANCHOR,
)
# What one core of the anchors' machines decodes: it tells their cores' speed from ours.
DECODE_ANCHOR = Anchor(
    "one-core decode", "full JPEG decode, one core, ImageNet-size, libjpeg-turbo on x86",
    690.0, 864.0, "ternaus/imread_benchmark")
# Our rate per core and an anchor's may differ this much before advise says so, and why.
ANCHOR_GAP = 1.5
# What one decoded training sample weighs on the wire: 224 x 224 RGB, uint8.
DECODED_SAMPLE_BYTES = 224 * 224 * 3


@dataclass(frozen=True)
class Remedy:
    """A change that would close a gap: the ``gain`` it gives the feed (a factor; NaN where
    it adds capacity rather than speed), whether that gain is ``measured`` in our rows,
    ``extrapolated`` from them, or ``cited`` from a public figure, and what it costs."""

    what: str
    gain: float
    kind: str
    detail: str

    def to_dict(self) -> dict:
        return {"what": self.what, "gain": self.gain, "kind": self.kind,
                "detail": self.detail}

    def text(self) -> str:
        gain = "" if not math.isfinite(self.gain) else f"{self.gain:.2f}\u00d7 the feed, "
        return f"{self.what}: {gain}{self.kind} ({self.detail})"


# The unit of every number in ``Advice.to_dict()`` that carries no ``unit`` beside it
# (a choice's ``median`` and a number's ``value`` do): its dotted path, ``[]`` for a list.
JSON_UNITS = {
    "situation.count": "samples", "situation.mean_bytes": "bytes",
    "situation.dataset_bytes": "bytes", "situation.rtt_ms": "ms", "situation.ram_gb": "GB",
    "situation.ram_ratio": "ratio (dataset bytes / RAM)", "situation.cores": "cores",
    "situation.accelerators": "accelerators", "situation.nodes": "nodes",
    "situation.demand_samples_per_s": "samples/s",
    "store.facets.k": "ratio (dataset bytes / RAM left for the page cache)",
    "store.facets.rtt_ms": "ms",
    # A recipe row's workers, as its study ran them on the reference's cores.
    "store.facets.workers": "workers", "loader.facets.workers": "workers",
    "loader.workers": "workers per accelerator",
    "in_flight_per_node": "requests",
    "busy.utilisation": "fraction of the demand", "busy.target": "fraction of the demand",
    "busy.headroom": "ratio (feed / demand)", "busy.headroom_needed": "ratio (feed / demand)",
    "busy.samples_per_s_per_accelerator": "samples/s",
    "busy.samples_per_s_per_core": "samples/s",
    "cores_per_accelerator_needed": "cores",
    "remedies[].gain": "ratio (feed after / feed now)",
    "numbers[].reference_value": "the number's own unit (the reference's value of it)",
    "measured_here.recipes[].samples_per_s": "samples/s",
    "measured_here.recipes[].reference_samples_per_s": "samples/s",
    "measured_here.recipes[].repeats": "repeats",
    "measured_here.recipes[].cores": "cores",
    "measured_here.recipes[].sample_bytes": "bytes",
}


@dataclass(frozen=True)
class RateHere:
    """One recipe the answer names (``role``: "answer" or "runner-up"), timed on this
    machine by ``advise --measure`` over ``dataset`` (its samples of ``sample_bytes``
    stored): the median samples/s in RAM after each epoch's first batch over ``repeats``,
    on ``cores`` cores; ``reference`` is the reference's rate of the same path, the one the
    answer used. Not measured: ``median`` NaN and ``skipped`` says why."""

    role: str
    recipe: str
    reference: float
    median: float = math.nan
    repeats: int = 0
    cores: float = math.nan
    sample_bytes: float = math.nan
    dataset: str = ""
    skipped: str = ""

    @property
    def measured(self) -> bool:
        return not self.skipped and math.isfinite(self.median)

    def number(self) -> Number:
        return Number(f"recipe {self.recipe} ({self.role}), in RAM", self.median, "samples/s",
                      MEASURED_HERE, f"{self.dataset}, {self.cores:g} cores, median of "
                      f"{self.repeats} repeats after each epoch's first batch",
                      reference=self.reference)

    def to_dict(self) -> dict:
        return {"role": self.role, "recipe": self.recipe, "measured": self.measured,
                "samples_per_s": self.median if self.measured else None,
                "reference_samples_per_s": self.reference, "repeats": self.repeats,
                "cores": self.cores if self.measured else None,
                "sample_bytes": self.sample_bytes if self.measured else None,
                "dataset": self.dataset, "skipped": self.skipped}


@dataclass(frozen=True)
class MeasuredHere:
    """What ``advise --measure`` timed on this machine (``machine``), written to
    ``results_dir``."""

    rates: tuple[RateHere, ...]
    machine: str
    results_dir: str

    @property
    def answer(self) -> RateHere | None:
        """The answer's recipe, where it was measured."""
        return next((r for r in self.rates if r.role == "answer" and r.measured), None)

    def to_dict(self) -> dict:
        return {"measured": self.answer is not None, "machine": self.machine,
                "results": self.results_dir, "recipes": [r.to_dict() for r in self.rates]}


@dataclass(frozen=True)
class Advice:
    """The answer to a ``Situation``: see ``text()`` and ``to_dict()``."""

    situation: Situation
    store: Choice
    loader: Choice
    decoder: Choice | None
    # None where the loader path sizes its own parallelism (``parallelism`` says how).
    workers: int | None
    per_core: float
    per_accelerator: float
    utilisation: float
    cores_needed: float
    numbers: tuple[Number, ...]
    assumptions: tuple[str, ...]
    notes: tuple[str, ...]
    machine: str
    run_id: str
    results_dir: str
    commands: tuple[str, ...]
    # What would close the gap where the answer is not "yes", ranked (``remedies``).
    remedies: tuple[Remedy, ...] = ()
    # How a path that sizes its own parallelism does (``LoaderPath.parallelism``), else "".
    parallelism: str = ""
    # Requests in flight per node that hide the round trip (Little's law); None on local disk.
    in_flight: int | None = None
    # The rates ``advise --measure`` timed on this machine, in place of the reference's.
    here: MeasuredHere | None = None

    @property
    def recipe(self):
        """The registry's recipe of the answer: the chosen loader path's where it reads its
        own files, else its path over the chosen store's layout; None where none is
        declared (the pipeline is then the two rows above, not one recipe)."""
        recipe = recipe_of(self.loader, None if self.decoder is None else self.decoder.key)
        path = loader_path_of(self.loader)
        if recipe is None or self.store.key == self.loader.key or (
                path is not None and path.reads_dataset_files):
            return recipe
        # The store's key names its format first: "memmap/preloaded", "tfrecord, shuffle".
        layout = re.split(r"[/,\s-]", self.store.key, maxsplit=1)[0]
        return recipe if recipe.layout == layout else None

    @property
    def parallelism_text(self) -> str:
        """``"8 workers"``, or the path's own, ``"AUTOTUNE (...)"``."""
        return self.parallelism or f"{self.workers} worker(s)"

    @property
    def headroom(self) -> float:
        """The feed per accelerator over the demand."""
        return self.per_accelerator / self.situation.demand

    @property
    def busy(self) -> str:
        """``yes`` (the feed has the headroom the GPU evidence covers, ``BUSY_HEADROOM``),
        ``marginal`` (it reaches ``BUSY_TARGET`` of the demand, short of that headroom) or
        ``no``."""
        if self.headroom >= BUSY_HEADROOM:
            return "yes"
        return "marginal" if self.headroom >= BUSY_TARGET else "no"

    @property
    def keeps_busy(self) -> bool:
        return self.busy == "yes"

    def to_dict(self) -> dict:
        return {
            "situation": self.situation.to_dict(),
            "store": self.store.to_dict(),
            "loader": {**self.loader.to_dict(), "workers": self.workers,
                       "parallelism": self.parallelism_text,
                       "recipe": None if self.recipe is None else self.recipe.name,
                       "decoder": None if self.decoder is None else self.decoder.to_dict()},
            "in_flight_per_node": self.in_flight,
            "busy": {"utilisation": self.utilisation, "target": BUSY_TARGET,
                     "keeps_busy": self.keeps_busy, "verdict": self.busy,
                     "headroom": self.headroom, "headroom_needed": BUSY_HEADROOM,
                     "samples_per_s_per_accelerator": self.per_accelerator,
                     "samples_per_s_per_core": self.per_core},
            "cores_per_accelerator_needed": self.cores_needed,
            "numbers": [n.to_dict() for n in self.numbers],
            "assumptions": list(self.assumptions),
            "notes": list(self.notes),
            "measured_on": {"machine": self.machine, "run_id": self.run_id,
                            "results": self.results_dir},
            "commands": list(self.commands),
            "remedies": [r.to_dict() for r in self.remedies],
            "measured_here": None if self.here is None else self.here.to_dict(),
            "units": dict(JSON_UNITS),
        }

    def text(self) -> str:
        s = self.situation
        verdict = self.busy
        if verdict == "marginal":
            verdict = (f"marginal: the feed is {self.headroom:.2f}\u00d7 the demand, and the "
                       f"GPU evidence covers {BUSY_HEADROOM:g}\u00d7 and more")
        decoder = "" if self.decoder is None else f", decoding with {self.decoder.text}"
        mine = self.here.answer if self.here is not None else None
        here = "" if mine is None else (
            f"; {MEASURED_HERE}: {format_value(mine.median, 'samples/s')} (the reference: "
            f"{format_value(mine.reference, 'samples/s')})")
        source = "" if mine is None else f", from the rate {MEASURED_HERE}"
        lines = [
            f"Situation: {s.text()}.",
            "",
            f"Store as:   {self.store.text}",
            f"            [{self.store.study}] {self.store.question}",
            f"Load with:  {self.loader.text}{decoder}; {self.parallelism_text} per "
            f"accelerator on {s.cores_per_accelerator:g} cores{here}",
            f"            [{self.loader.study}] {self.loader.question}",
            *([f"Recipe:     storebench recipes {self.recipe.name} (its code, tuning and "
               "where it cannot serve)"] if self.recipe is not None else []),
            f"Busy:       {verdict}, about "
            f"{format_percent(self.utilisation)} (about "
            f"{format_value(self.per_accelerator, 'samples/s')} per accelerator{source} "
            f"against {format_value(s.demand, 'samples/s')} needed)",
            f"Cores:      about {self.cores_needed:.1f} per accelerator needed; you have "
            f"{s.cores_per_accelerator:g}",
            *([f"In flight:  about {self.in_flight:,} requests per node to hide "
               f"{s.rtt_ms:g} ms (Little's law, below)"] if self.in_flight is not None
              else []),
        ]
        lines += [f"Note:       {note}" for note in self.notes]
        if self.remedies:
            lines += ["", f"To reach {BUSY_HEADROOM:g}\u00d7 the demand (the feed is "
                          f"{self.headroom:.2f}\u00d7; largest gain first):"]
            lines += [f"  {i}. {r.text()}" for i, r in enumerate(self.remedies, start=1)]
        if self.here is not None:
            lines += ["", f"{MEASURED_HERE.capitalize()}, on {self.here.machine} "
                          f"({self.here.results_dir}), the reference's value beside:"]
            lines += [f"  {r.number().text()}" if r.measured else
                      f"  skipped       recipe {r.recipe} ({r.role}): {r.skipped}"
                      for r in self.here.rates]
        run = f"run {self.run_id}, " if self.run_id else ""
        lines += ["", f"Measured on {self.machine} ({run}{self.results_dir}):"]
        lines += [f"  {n.text()}" for n in self.numbers]
        lines += ["", "Assumptions behind the extrapolated numbers:"]
        lines += [f"  - {a}" for a in self.assumptions]
        lines += ["", "Measure it on your data:"] + [f"  {c}" for c in self.commands]
        return "\n".join(lines)


# -- the results ---------------------------------------------------------------------------
def check_results(results, needed: Sequence[str]) -> str:
    """The profile of ``results``' rows; refuses (one line) rows of several profiles, of a
    compact plan, or without the studies ``needed``."""
    from ..bench.plan import plan_for

    where = results.directory or "results"
    profiles = sorted(set(results.df["profile"].astype(str)))
    if len(profiles) != 1:
        raise AdviceError(f"{where}: rows of several profiles ({', '.join(profiles)}); advise "
                          "reads one study's results")
    profile = profiles[0]
    plan = str(results.env.get("plan") or profile)
    if plan_for(plan).compact:
        raise AdviceError(f"{where}: results of the {plan!r} profile, a compact smoke-test "
                          "plan whose numbers are not a reference; use results/reference or "
                          "a full study's results")
    missing = [name for name in needed if not (results.df["study"] == name).any()]
    if missing:
        raise AdviceError(f"{where}: no rows of the {', '.join(missing)} "
                          f"stud{'ies' if len(missing) > 1 else 'y'} this situation needs "
                          f"(storebench run --study {missing[0]})")
    return profile


def guide_rows(results, study: str, **facets) -> list:
    """The ``study``'s guide rows whose facets hold ``facets``."""
    from ..studies import get_study

    return [row for row in get_study(study).guide(results)
            if row is not None and all(row.facets.get(k) == v for k, v in facets.items())]


def rows_for_kind(results, study: str, kind: str, **facets) -> list:
    """``study``'s rows for image ``kind``; refused (``AdviceError``, naming the nearest kind
    measured) where it has none: one encoding's rates never stand in for another's."""
    rows = guide_rows(results, study, encoding=kind, **facets)
    if rows:
        return rows
    nearest = [ENCODING_NAMES[e] for e in NEAREST_KIND[kind]
               if guide_rows(results, study, encoding=e, **facets)]
    raise NotMeasuredError(
        f"{ENCODING_NAMES[kind]}: not measured (the {study} study of {results.directory} read "
        f"none)" + (f"; nearest measured: {', '.join(nearest)}, whose rates are not "
                    f"{ENCODING_NAMES[kind]}'s" if nearest else ""))


def sample_bytes(results, encoding: str) -> float:
    """The mean stored bytes of one of the reference set's ``encoding`` samples: its
    one-file-per-sample build's bytes over its files."""
    from ..results import default_builds, stat

    rows = default_builds(results.study("formats"))
    where = {"study": "formats", "format": "rawfiles", "encoding": encoding}
    total = stat(rows, "bytes_apparent", **where).median
    return total / stat(rows, "file_count", **where).median


def disk_kind(storage: Mapping) -> str | None:
    """The ``DISK_KINDS`` entry of env.json's ``storage`` (its block device), or None."""
    device = str(storage.get("device") or "")
    if device.startswith(("vd", "xvd")):
        return "virtio"
    if device.startswith("nvme"):
        return "nvme"
    if device.startswith(("sd", "hd")):
        return "hdd" if storage.get("rotational") else "ssd"
    return None


def disk_text(results) -> str:
    """The measured disk in words: ``"a virtio disk (ext4 vda), 2.24 GB/s guest-cold
    sequential"``: on a VM the host may cache what the guest evicted, so it is not the
    device's rate (docs/methodology.md, "Cold on a virtual machine")."""
    storage = results.env.get("storage", {})
    kind = disk_kind(storage)
    where = " ".join(str(storage[k]) for k in ("fs_type", "device") if storage.get(k))
    cold = results.limits.get("cold_seq_read_GBps")
    return ((DISK_NAMES[kind] if kind else "the reference's disk")
            + (f" ({where})" if where else "")
            + (f", {format_value(cold, 'GB/s')} {GUEST_COLD} sequential" if cold else ""))


@dataclass
class _Draft:
    """What the answer's parts add as they are worked out."""

    numbers: list[Number] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def recipe_row_in_ram(results, images: str, resize: str = "antialiased"):
    """The peers study's guide row for ``images`` in RAM: whole pipelines (layout, reader,
    decoder, training crop and loader), each timed end to end over the cached set, warm,
    epochs 2 and on, their crops resizing with the ``resize`` filter class; None where the
    results hold none."""
    if not (results.df["study"] == "peers").any():
        return None
    rows = guide_rows(results, "peers", encoding=images, cache="warm", filter=resize)
    if not rows and images == "raw":
        # Raw arrays' crops all resize one way: their row names no filter class.
        rows = guide_rows(results, "peers", encoding=images, cache="warm")
    return rows[0] if rows else None


def recipe_versus_default(results, images: str):
    """(the in-RAM answer's guide row, the tuned DataLoader's candidate in it, (ratio, low,
    high, verdict) of the answer over it under the decision rule): both read from the one
    row, so the rate and the ratio come from the same run; None where either is missing."""
    from ..guide import compare
    from ..studies.peers.study import DEFAULT_PATH

    row = recipe_row_in_ram(results, images)
    default = None if row is None else next(
        (c for c in row.candidates if c.key == ":".join(DEFAULT_PATH)), None)
    if default is None:
        return None
    return row, default, compare(row.best.stat, default.stat, lower_is_better=False)


def recipe_store(row) -> Choice:
    """The store half of a recipe answer: ``row``'s choice, each recipe named by the layout
    it reads, cached in RAM; a runner-up on the same layout leaves nothing to choose."""
    from ..studies.peers.study import key_parts

    layout = {c.label: f"{key_parts(c.key)[1]} (in RAM)" for c in row.candidates}
    choice = Choice.of(row)
    label = layout[choice.label]
    tied = tuple(t for t in dict.fromkeys(layout[t] for t in choice.tied) if t != label)
    runner_up = layout.get(choice.runner_up) if choice.runner_up else None
    return dataclasses.replace(choice, label=label, tied=tied,
                               runner_up=None if runner_up == label else runner_up,
                               worst=None, worst_median=math.nan)


def _first_epoch_notes(results, s: Situation, encoding: str, draft: _Draft) -> None:
    """What the first epoch, read from disk before the set is cached, adds to an answer in
    RAM."""
    first = guide_rows(results, "lazy_vs_preloaded", epochs="first", encoding=encoding)
    if first:
        draft.notes.append(f"for the first epoch from a {GUEST_COLD} cache: "
                           f"{Choice.of(first[0]).text}")
    if s.disk is not None and s.disk != disk_kind(results.env.get("storage", {})):
        draft.notes.append(f"the first epoch reads {DISK_NAMES[s.disk]}, not measured "
                           f"(measured: {disk_text(results)}); later epochs read RAM")


def _store_local(results, s: Situation, draft: _Draft) -> tuple[Choice, float]:
    """(the format choice, the samples/s node bound beyond the cores) on local disk."""
    if s.fits_in_ram:
        rows = rows_for_kind(results, "lazy_vs_preloaded", s.images, epochs="later")
        _first_epoch_notes(results, s, rows[0].facets["encoding"], draft)
        draft.notes.append(
            "the store and the loader answer two questions measured apart (the peers study, "
            "which times whole pipelines in RAM, is not in these results)")
        return Choice.of(rows[0]), math.inf
    rows = rows_for_kind(results, "out_of_core", s.images)
    by_k = sorted(rows, key=lambda r: r.facets["k"])
    row = next((r for r in by_k if r.facets["k"] >= s.ram_ratio), by_k[-1])
    if row.facets["k"] < s.ram_ratio:
        draft.notes.append(f"your set is {s.ram_ratio:.2g}\u00d7 the RAM; the largest ratio "
                           f"measured is {row.facets['k']}\u00d7 (the RAM left for the page "
                           "cache)")
    disk = (results.limits.get("cold_seq_read_GBps") or math.nan) * 1e9
    bound = disk / s.mean_bytes if math.isfinite(disk) else math.inf
    if math.isfinite(bound):
        draft.numbers.append(Number(
            "the disk's bound per node at your sample size", bound, "samples/s",
            "extrapolated", f"{GUEST_COLD} sequential read {format_value(disk / 1e6, 'MB/s')} "
            "(env.json limits; a cache below the VM may have served part of it, so a device "
            "may read slower) over your mean bytes"))
        draft.assumptions.append(
            f"your disk reads sequentially as fast as the reference's, {disk_text(results)} "
            "(--disk names another kind); a block-shuffled epoch reads nearly sequentially")
    return Choice.of(row), bound


def _store_remote(results, s: Situation, draft: _Draft) -> tuple[Choice, float]:
    """(the format choice, the node bound) for data ``rtt_ms`` away."""
    rows = sorted(guide_rows(results, "remote"), key=lambda r: r.facets["rtt_ms"])
    if not rows:
        raise AdviceError(f"{results.directory}: the remote study has no guide rows")
    measured = ", ".join(f"{rtt:g}" for rtt in sorted({r.facets["rtt_ms"] for r in rows}))
    nearest = f"nearest measured: object storage (S3) at {measured} ms round trips"
    if s.storage == "nfs":
        raise NotMeasuredError(f"a network file system: not measured; {nearest}, whose "
                               "rates are not a file system's")
    farthest = rows[-1].facets["rtt_ms"]
    if s.rtt_ms > MAX_RTT_FACTOR * farthest:
        raise NotMeasuredError(f"a round trip of {s.rtt_ms:g} ms: not measured, and more "
                               f"than {MAX_RTT_FACTOR:g}\u00d7 the farthest measured; {nearest}")
    encodings = {r.facets.get("encoding", "jpeg") for r in rows}
    if s.images not in encodings:
        raise NotMeasuredError(
            f"{ENCODING_NAMES[s.images]} in object storage: not measured; {nearest}, of "
            f"{', '.join(ENCODING_NAMES[e] for e in sorted(encodings))}")
    row = next((r for r in rows if r.facets["rtt_ms"] >= s.rtt_ms), rows[-1])
    if row.facets["rtt_ms"] < s.rtt_ms:
        draft.notes.append(f"{s.rtt_ms:g} ms is farther than any round trip measured "
                           f"({row.facets['rtt_ms']:g} ms): the rate below is an upper bound; "
                           "more requests in flight hide distance (storebench.remote.capacity)")
    draft.assumptions.append(
        "the reference's S3 server and delaying proxy ran on the loader's cores: the CPU "
        "they used is taken out before the rate is divided by cores, yet their share of "
        "memory bandwidth and caches is not")
    return Choice.of(row), math.inf


def loader_rates(rows: Sequence) -> list:
    """The prefetch study's ``rows`` that compare loader rates. It also asks which path is
    fastest to a first batch: those rows are seconds, not rates, and no loader or decoder
    is chosen by them."""
    return [row for row in rows if row.best.stat.unit == "samples/s"]


def recipe_situation(s: Situation) -> str:
    """The recipes' name for where ``s``'s data lives (``storebench.recipes.SITUATIONS``)."""
    from ..recipes import IN_RAM, OBJECT_STORAGE, OUT_OF_CORE

    if s.storage != "local":
        return OBJECT_STORAGE
    return IN_RAM if s.fits_in_ram else OUT_OF_CORE


def measured_paths(results, s: Situation) -> tuple[str, set[str]] | None:
    """(the study, the loader paths it ran) for where ``s``'s data lives, outside RAM (the
    out_of_core or remote study); None in RAM, where the prefetch study is the measure."""
    if recipe_situation(s) == "in RAM":
        return None
    study = needed_studies(s)[1]
    rows = results.study(study)
    return study, {str(p) for p in rows["prefetcher"].dropna() if str(p)}


def serving(row, situation: str, notes: list[str],
            measured: tuple[str, set[str]] | None = None):
    """``row`` without the candidates that are no answer in ``situation`` (None when none
    is left): a path that reads its own files (tf.data, a peer's loader) whose recipe cannot
    serve it, or, with ``measured`` (a study and the paths it ran there), a path that study
    did not run. Where its best is dropped, ``notes`` says why. A path over storebench's
    readers reads whatever the store chosen is, so the store decides where it serves."""
    from ..guide import choose
    from ..loaders.paths import LOADER_PATHS

    kept = []
    for candidate in row.candidates:
        path = next((LOADER_PATHS[part] for part in candidate.key.split("/")
                     if part in LOADER_PATHS), None)
        recipe = (recipe_for(candidate.key, str(row.facets.get("dataset", "")))
                  if path is not None and path.reads_dataset_files else None)
        reason = "" if recipe is None else (
            f"its recipe ({recipe.name}) cannot serve {situation}: "
            f"{recipe.why_not(situation)}" if recipe.why_not(situation) else "")
        if not reason and measured is not None and (path is None
                                                    or path.name not in measured[1]):
            ran = sorted(LOADER_PATHS[n].label if n in LOADER_PATHS else n
                         for n in measured[1])
            reason = (f"not measured {situation} (the {measured[0]} study ran "
                      f"{', '.join(ran) or 'no loader path'})")
        if not reason:
            kept.append(candidate)
        elif candidate is row.best:
            note = f"not {candidate.label}, the fastest in RAM: {reason}"
            if note not in notes:
                notes.append(note)
    if len(kept) == len(row.candidates):
        return row
    return choose(row.study, row.question, row.metric, kept,
                  lower_is_better=row.lower_is_better, facets=row.facets)


def _loader(results, kind: str, situation: str | None = None,
            notes: list[str] | None = None,
            measured: tuple[str, set[str]] | None = None,
            decode: str | None = None,
            timed_with: str | None = None) -> tuple[Choice, Choice | None]:
    """(the loader path, the decoder or None for raw arrays): the guide's choice among the
    prefetch study's paths whose recipe can serve ``situation`` (all where None; why a
    faster one cannot goes to ``notes``), and among decoders by their best paths; with
    ``decode`` (what the situation's study decoded with), that decoder's row, since no
    other was measured there (a faster one in RAM goes to ``notes``); with ``timed_with``
    (the path that study ran, a candidate key prefix such as ``"thread/w2/"``), that path,
    so the answer names the pipeline that was timed."""
    from ..guide import Candidate, choose

    rows = loader_rates(rows_for_kind(results, "prefetch", kind))
    if situation is not None:
        rows = [r for r in (serving(row, situation, notes if notes is not None else [],
                                    measured) for row in rows) if r is not None]
    if not rows:
        raise AdviceError(f"{results.directory}: the prefetch study has no loader rates "
                          f"(samples/s) for {ENCODING_NAMES[kind]}")
    if rows[0].facets["decode"] == "none":
        return _timed_path(rows[0], timed_with, situation, notes), None
    picked = choose("prefetch", "which decoder, by each decoder's best loader path?",
                    "samples_per_s", [Candidate(r.facets["decode"], r.facets["decode"],
                                                r.best.stat) for r in rows])
    if decode is not None and picked.best.key != decode and any(
            r.facets["decode"] == decode for r in rows):
        if notes is not None:
            notes.append(f"not the {picked.best.label} decoder, the fastest in RAM: not "
                         f"measured {situation}, where the rate above decodes with {decode}")
        measured_decoder = [c for c in picked.candidates if c.key == decode]
        picked = choose("prefetch", f"which decoder {situation}? (the one measured there)",
                        "samples_per_s", measured_decoder)
    decoder = Choice.of(picked)
    best = next(r for r in rows if r.facets["decode"] == decoder.key)
    loader = _timed_path(best, timed_with, situation, notes)
    path = loader_path_of(loader)
    if path is not None and path.decoder_text:
        # The path decodes itself (tf.data with TensorFlow): that, not the decoder of the
        # question it answered, is what decodes.
        decoder = dataclasses.replace(decoder, key=path.decode, label=path.decoder_text)
    return loader, decoder


def _timed_path(row, timed_with: str | None, situation: str | None,
                notes: list[str] | None) -> Choice:
    """``row``'s choice or, given ``timed_with``, its candidate on that path alone (a faster
    one in RAM goes to ``notes``)."""
    from ..guide import choose

    timed = [c for c in row.candidates if timed_with and c.key.startswith(timed_with)]
    if not timed:
        return Choice.of(row)
    if timed[0] is not row.best and notes is not None:
        notes.append(f"not {row.best.label}, the fastest in RAM: {situation}, the rate above "
                     f"was timed through {timed[0].label}")
    return Choice.of(choose(row.study, row.question, row.metric, timed[:1],
                            facets=row.facets))


def loader_path_of(choice: Choice):
    """The ``LoaderPath`` a loader choice's key names (``tf_data/w0/``, ``lazy/thread``),
    or None."""
    from ..loaders.paths import LOADER_PATHS

    return next((LOADER_PATHS[part] for part in re.split(r"[/:]", choice.key)
                 if part in LOADER_PATHS), None)


def recipe_of(loader: Choice, decode: str | None = None):
    """The recipe (``storebench.recipes``) of a loader choice (``recipe_for``); a peers
    study's choice names its path, layout and variant in its key (``thread:lmdb:window``)."""
    if loader.study == "peers":
        from ..studies.peers.study import decode_for, key_parts

        path, layout, variant = key_parts(loader.key)
        encoding = str(loader.facets.get("encoding", "jpeg"))
        decode = "window" if "window" in variant.split("+") else decode_for(encoding)
        return recipe_for(path, f"{layout}-{encoding}", decode)
    return recipe_for(loader.key, str(loader.facets.get("dataset", "")), decode)


def recipe_for(key: str, dataset: str, decode: str | None = None):
    """The recipe of loader path key ``key`` (``tf_data/w0/``): the one of its path over
    ``dataset`` (decoding with ``decode`` where several are; the studies' rows resize
    antialiased), or its path's only recipe; None where none is declared."""
    from ..loaders.paths import LOADER_PATHS
    from ..recipes import RECIPES

    path = next((LOADER_PATHS[part] for part in key.split("/") if part in LOADER_PATHS),
                None)
    if path is None:
        return None
    mine = [r for r in RECIPES.values() if r.loader == path.name]
    mine = ([r for r in mine if r.decode == decode] or mine) if decode else mine
    mine.sort(key=lambda r: r.transform.filter != "antialiased")
    exact = [r for r in mine if f"{r.layout}-{r.encoding}" == dataset]
    found = exact or (mine if len(mine) == 1 else [])
    return found[0] if found else None


def _workers(loader: Choice, cores: float, ref_cores: int) -> int | None:
    """The measured path's workers per reference core, on ``cores`` cores; None for a path
    that sizes its own parallelism."""
    path = loader_path_of(loader)
    if path is not None and path.parallelism:
        return None
    parts = [p for p in loader.key.split("/") if p.startswith("w") and p[1:].isdigit()]
    measured = int(parts[0][1:]) if parts else int(loader.facets.get("workers", 1))
    return max(1, round(max(measured, 1) * cores / ref_cores))


def needed_studies(s: Situation) -> tuple[str, ...]:
    where = ("remote" if s.storage != "local" else
             "lazy_vs_preloaded" if s.fits_in_ram else "out_of_core")
    return ("formats", where, "prefetch")


def advise(situation: Situation, results, *, dataset: Path | str | None = None,
           here: MeasuredHere | None = None) -> Advice:
    """The answer to ``situation`` from ``results`` (a ``storebench.results.Results``);
    ``NotMeasuredError`` where it lies farther from the measured rows than advise
    extrapolates, with the commands that measure the user's own. ``here``: rates timed on
    this machine (``advise --measure``), which replace the reference's rate the answer
    rests on."""
    try:
        return _advise(situation, results, dataset=dataset, here=here)
    except NotMeasuredError as err:
        own = (f"storebench study --dataset {dataset}" if dataset is not None else
               "storebench import YOUR_IMAGE_FOLDER --out data/mine, then storebench study "
               "--dataset data/mine")
        raise NotMeasuredError(f"{err}; measure yours: {own}") from None


def _advise(situation: Situation, results, *, dataset: Path | str | None,
            here: MeasuredHere | None = None) -> Advice:
    from ..text import machine_text

    s = situation
    check_results(results, needed_studies(s))
    # Every way the situation lies beyond the rows, said at once, before any is answered.
    refused = unmeasured(s, results, s.images)
    if refused:
        raise NotMeasuredError("; also ".join(refused))
    draft = _Draft()
    # In RAM the answer is one recipe, store and loader timed together; elsewhere the
    # situation's study times the stores through one loader path, chosen in RAM.
    recipe_row = (recipe_row_in_ram(results, s.images, s.resize)
                  if s.storage == "local" and s.fits_in_ram else None)
    if recipe_row is not None:
        _first_epoch_notes(results, s, s.images, draft)
        store, bound = recipe_store(recipe_row), math.inf
        loader, decoder = Choice.of(recipe_row), None
        path = loader_path_of(loader)
        if path is not None and path.decoder_text:
            # The path decodes itself (tf.data with TensorFlow): its decoder is named.
            decoder = dataclasses.replace(loader, key=path.decode, label=path.decoder_text,
                                          tied=(), runner_up=None, worst=None)
    else:
        store, bound = (_store_local if s.storage == "local" else _store_remote)(
            results, s, draft)
        timed = case_knobs(store.evidence[0][1]) if store.evidence else {}
        loader, decoder = _loader(results, s.images, recipe_situation(s), draft.notes,
                                  measured_paths(results, s), timed.get("decode"),
                                  timed.get("path"))
    draft.notes += [c.avoid for c in (store, loader) if c.avoid]
    path = loader_path_of(loader)
    store_format = store.facets.get("format") or store.key.partition(":")[0]
    if recipe_row is None and path is not None and path.dataset_format and not str(
            store_format).startswith(path.dataset_format):
        # Store and loader come from different questions: say where they do not fit.
        draft.notes.append(
            f"{path.label} reads {path.dataset_format} files only: to load with it, store as "
            f"{path.dataset_format}; {store.label} is the best of the measured stores, read "
            "through storebench's readers, not a pipeline measured with this loader")
    ref_cores = int(results.env.get("cpus_usable") or results.env.get("cpu_count") or 1)
    # The rate the answer rests on: the chosen format's own (read and decoded, on the
    # reference's cores) where the data outgrows RAM or sits at a distance; in RAM, the
    # chosen loader path's over a cached set.
    basis = loader if s.storage == "local" and s.fits_in_ram else store
    encoding = basis.facets.get("encoding", "jpeg")
    ref_bytes = sample_bytes(results, encoding)
    loader_cores = _loader_cores(results, basis, ref_cores, draft)
    per_core = basis.median / loader_cores * ref_bytes / s.mean_bytes
    per_core_basis = (f"the measured rate over {loader_cores:.3g} cores"
                      + (" (the cores the S3 server and proxy left)"
                         if loader_cores < ref_cores else "")
                      + f", times {format_value(ref_bytes, 'bytes')} / "
                      f"{format_value(s.mean_bytes, 'bytes')}")
    reference_per_core = None
    mine = here.answer if here is not None else None
    if mine is not None:
        reference_per_core = per_core
        if basis is loader:
            per_core = mine.median / mine.cores * mine.sample_bytes / s.mean_bytes
            per_core_basis = (f"the rate {MEASURED_HERE} over {mine.cores:g} cores, times "
                              f"{format_value(mine.sample_bytes, 'bytes')} / "
                              f"{format_value(s.mean_bytes, 'bytes')}")
        else:
            # Only RAM is timed here: the store's rate is the reference's, times how much
            # faster a core here ran the answer's recipe in RAM than a core there, per byte.
            speed = (mine.median / mine.cores * mine.sample_bytes) / (
                mine.reference / ref_cores * ref_bytes)
            per_core *= speed
            per_core_basis += (f", times {speed:.2f}: a core's rate in RAM {MEASURED_HERE} "
                               "over the reference's, the answer's recipe, per byte")
    per_accelerator = min(per_core * s.cores_per_accelerator, bound / s.accelerators)
    draft.numbers[:0] = [
        Number(f"{basis.label}, {ENCODING_NAMES[encoding]} samples of "
               f"{format_value(ref_bytes, 'bytes')}", basis.median, basis.unit, "measured",
               f"{basis.study} study, {ref_cores} cores, median of its repeats"
               + basis_run_text(results, basis.study, encoding)),
        Number("per core at your sample size", per_core, "samples/s", "extrapolated",
               per_core_basis, reference=reference_per_core),
        Number("per accelerator on your cores", per_accelerator, "samples/s", "extrapolated",
               f"per core times {s.cores_per_accelerator:g} cores"
               + (", capped by the node's bound" if per_core * s.cores_per_accelerator
                  > bound / s.accelerators else ""),
               reference=None if reference_per_core is None else min(
                   reference_per_core * s.cores_per_accelerator, bound / s.accelerators)),
    ]
    decode = basis_decoder(basis)
    if s.images == "jpeg":
        comparison, why = per_core_anchors(results, basis.median / loader_cores, decode,
                                           ref_bytes)
        draft.numbers += comparison
        draft.notes += why
    if decode is not None and decoder is not None and decode != decoder.key:
        # The rate rests on the decoder the basis study ran, not always the one chosen.
        draft.notes.append(
            f"the rate above decodes with {decode} (what the {basis.study} study ran); "
            f"the decoder named, {decoder.label}, is the prefetch study's choice in RAM")
    total = s.demand * s.accelerators * s.nodes
    draft.numbers.append(Number(
        f"what the storage delivers to all {s.nodes * s.accelerators} accelerator(s)",
        total * s.mean_bytes / 1e6, "MB/s", "extrapolated",
        f"{format_value(total, 'samples/s')} times your mean bytes"))
    in_flight = None
    if s.storage != "local" and s.rtt_ms:
        in_flight, spr, measured = requests_in_flight(results, store, s)
        draft.numbers.append(Number(
            "requests in flight per node to hide the round trip", in_flight, "requests",
            "extrapolated",
            f"Little's law: {format_value(BUSY_HEADROOM * s.demand * s.accelerators, 'samples/s')}"
            f" a node ({BUSY_HEADROOM:g}\u00d7 the demand), {spr:.3g} sample(s) a request "
            f"(measured), times {s.rtt_ms:g} ms; the rows measured {measured} in flight"))
    scaling, efficiency = scaling_assumption(
        results, encoding, ref_cores, getattr(loader_path_of(loader), "name", None),
        s.cores_per_accelerator)
    if efficiency is not None:
        draft.numbers.append(efficiency)
    draft.assumptions[:0] = [
        "the loader's rate per core holds on your cores (the measured paths are CPU-bound: "
        "reading, checking and decoding)",
        scaling,
        "a sample's CPU cost scales with its stored bytes (decode work grows with pixels)",
        "the accelerators' compute overlaps loading: a feed with "
        f"{BUSY_HEADROOM:g}\u00d7 the demand keeps them busy (the gpu_feed study: at "
        f"{BUSY_HEADROOM:g}\u00d7 the accelerator's rate and more, 95% busy and more)",
    ]
    if s.nodes > 1:
        draft.assumptions.append("each node reads on its own link and disk; the storage "
                                 "serves all nodes at once (not measured)")
    advice = Advice(
        s, store, loader, decoder, _workers(loader, s.cores_per_accelerator, ref_cores),
        per_core, per_accelerator, min(1.0, per_accelerator / s.demand), s.demand / per_core,
        tuple(draft.numbers), tuple(dict.fromkeys(draft.assumptions)), tuple(draft.notes),
        machine_text(results.env), str(results.env.get("run_id", "")),
        str(results.directory or ""), measure_commands(s, dataset),
        parallelism=getattr(loader_path_of(loader), "parallelism", ""), in_flight=in_flight,
        here=here)
    if advice.busy == "yes":
        return advice
    return dataclasses.replace(advice, remedies=remedies(advice, results, bound=bound))


def unmeasured(s: Situation, results, encoding: str) -> list[str]:
    """Why ``s`` lies beyond what ``results`` measured and advise extrapolates: samples
    more than ``MAX_BYTES_FACTOR`` from the measured set's ``encoding`` samples, or a set
    larger than RAM on another disk kind than the measured one; each names the nearest
    measured. Image kinds, storages and round trips are refused where their rows are
    chosen."""
    from ..results import MissingResultError

    found = []
    if s.disk is not None and not s.fits_in_ram and s.disk != disk_kind(
            results.env.get("storage", {})):
        found.append(f"{DISK_NAMES[s.disk]} for a set {s.ram_ratio:.2g}\u00d7 the RAM: not "
                     f"measured; nearest measured: {disk_text(results)}, whose bandwidth "
                     "and queue depth are its own")
    try:
        ref_bytes = sample_bytes(results, encoding)
    except MissingResultError:
        return found  # the kind itself is refused where its rows are looked up
    if not 1 / MAX_BYTES_FACTOR <= s.mean_bytes / ref_bytes <= MAX_BYTES_FACTOR:
        found.append(
            f"samples of {format_value(s.mean_bytes, 'bytes')}: not measured, more than "
            f"{MAX_BYTES_FACTOR:g}\u00d7 from the measured set's "
            f"{format_value(ref_bytes, 'bytes')} ({ENCODING_NAMES[encoding]}), and a sample's "
            "cost is not proportional to its bytes that far; nearest measured: "
            f"{format_value(ref_bytes, 'bytes')}")
    return found


def case_knobs(case_id: str) -> dict[str, str]:
    """A case id's ``key=value`` parts, and its loader path as ``path``
    (``"thread/w2/"``, the prefetch study's candidate key prefix)."""
    parts = case_id.partition(":")[2].split("/")
    knobs = dict(part.split("=", 1) for part in parts if "=" in part)
    if len(parts) > 3 and parts[3].startswith("w"):
        knobs["path"] = f"{parts[2]}/{parts[3]}/"
    return knobs


def basis_decoder(basis: Choice) -> str | None:
    """The decoder the rows behind ``basis`` ran (``decode=`` in its case id), or None."""
    if basis.facets.get("decode"):
        return str(basis.facets["decode"])
    knobs = case_knobs(basis.evidence[0][1]) if basis.evidence else {}
    return knobs.get("decode")


def evidence_median(results, choice: Choice, metric: str) -> float:
    """The median of ``metric`` over the repeats of the case behind ``choice``'s best; NaN
    where that case did not record it."""
    from ..results import MissingResultError, stat

    if not choice.evidence:
        return math.nan
    study, case_id, _ = choice.evidence[0]
    try:
        return stat(results.study(study), metric, case_id=case_id).median
    except MissingResultError:
        return math.nan


def basis_run_text(results, study: str, encoding: str) -> str:
    """Where ``study``'s rows of ``encoding`` were measured, where not by the run the
    results are named for: its workload, run and machine (``Results.study_env``)."""
    from ..text import machine_text

    env = results.study_env(study)
    if not env or env.get("run_id") == results.env.get("run_id"):
        return ""
    workload = results.workload(study, encoding)
    return ((f"; on {workload}" if workload else "")
            + f"; measured in a run of its own: {machine_text(env)}")


def _loader_cores(results, basis: Choice, ref_cores: int, draft: _Draft) -> float:
    """The cores the loader had in ``basis``'s case: the reference's, less what the S3
    server and the delaying proxy used on the same machine (measured per case)."""
    others = [evidence_median(results, basis, m) for m in ("server_cores", "proxy_cores")]
    others = [v for v in others if math.isfinite(v)]
    if basis.study != "remote" or not others:
        return float(ref_cores)
    taken = sum(others)
    draft.numbers.append(Number(
        "the S3 server's and the delaying proxy's CPU in that case, not the loader's",
        taken, "cores", "measured", "remote study, medians of its repeats; taken out of the "
        f"{ref_cores} cores before dividing"))
    return max(ref_cores - taken, 0.5)


def decoder_rates(results, path: str) -> dict[str, float]:
    """JPEG decoder -> the prefetch study's loader rate through ``path`` (a candidate key
    prefix such as ``"thread/w2/"``; ``"none/w0/"`` is one thread, no prefetcher)."""
    rates = {}
    for row in loader_rates(guide_rows(results, "prefetch", encoding="jpeg")):
        found = [c for c in row.candidates if c.key.startswith(path)]
        if found and "decode" in row.facets:
            rates[str(row.facets["decode"])] = found[0].stat.median
    return rates


# Decoders that decode the whole image at full scale. The one-thread rate of the fastest
# of them on the set is the run's one-core calibration: what the anchors' one-core decode
# rates measure on theirs.
FULL_DECODERS = ("simplejpeg", "pil")


@dataclass(frozen=True)
class CoreCalibration:
    """How fast one core of the measuring machine is: one thread, no prefetcher, decoding
    the set's samples whole with ``decoder`` through the training crop (the prefetch
    study's row ``source``, a (study, case_id))."""

    rate: float
    decoder: str
    dataset: str
    source: tuple[str, str]

    def number(self) -> Number:
        return Number(
            f"one thread, no prefetcher, full {self.decoder} decode through the training crop",
            self.rate, "samples/s", "measured",
            f"prefetch study, {self.dataset}, the same run: how fast one of these cores is")


def loader_table(results, encoding: str):
    """The prefetch study's table (``prefetch_table``) of the set of ``encoding``, with a
    ``start_method`` column."""
    from ..studies.prefetch.report import prefetch_table

    table = prefetch_table(results.df)
    table = table[table["dataset"].str.endswith(f"-{encoding}")]
    return table.assign(start_method=[p.split("/")[2] for p in table["path"]])


def core_calibration(results, encoding: str = "jpeg") -> CoreCalibration | None:
    """The run's one-thread full-decode rate of its ``encoding`` set: the fastest of
    ``FULL_DECODERS`` measured; None where the prefetch study ran none."""
    table = loader_table(results, encoding)
    one = table[(table["prefetcher"] == "none") & table["decode"].isin(FULL_DECODERS)]
    if one.empty:
        return None
    best = one.loc[one["samples_per_s"].idxmax()]
    source = best["stat"].sources[0] if best["stat"].sources else ("prefetch", "")
    return CoreCalibration(float(best["samples_per_s"]), str(best["decode"]),
                           str(best["dataset"]), (source[0], source[1]))


@dataclass(frozen=True)
class Scaling:
    """One loader path measured at one worker and at ``workers`` on the same set and
    decoder: ``efficiency`` is the second rate over ``workers`` times the first (1.0 is
    linear)."""

    label: str
    prefetcher: str
    decoder: str
    one: float
    many: float
    workers: int

    @property
    def efficiency(self) -> float:
        return self.many / (self.workers * self.one)

    @property
    def text(self) -> str:
        return (f"{self.label}, {self.decoder}: {format_value(self.one, 'samples/s')} on 1 "
                f"worker, {format_value(self.many, 'samples/s')} on {self.workers}, "
                f"{self.efficiency:.2f} of linear")


def scaling_evidence(results, encoding: str, cores: int) -> list[Scaling]:
    """Every loader path of the prefetch study measured at 1 worker and at ``cores``
    workers (the run's cores) on its ``encoding`` set with one decoder, least efficient
    first."""
    from ..loaders.paths import path_label

    table = loader_table(results, encoding)
    found = []
    for (prefetcher, method, decode), part in table.groupby(
            ["prefetcher", "start_method", "decode"]):
        by_workers = dict(zip(part["workers"], part["samples_per_s"]))
        if prefetcher == "none" or 1 not in by_workers or cores not in by_workers \
                or cores == 1:
            continue
        found.append(Scaling(path_label(prefetcher, 1, method or None).replace(" \u00d71", ""),
                             str(prefetcher), str(decode), float(by_workers[1]),
                             float(by_workers[cores]), cores))
    return sorted(found, key=lambda s: s.efficiency)


def scaling_assumption(results, encoding: str, cores: int, path_name: str | None,
                       user_cores: float) -> tuple[str, Number | None]:
    """The assumption behind scaling the rate per core from the run's ``cores`` to the
    user's ``user_cores``, with its evidence: the 1- to ``cores``-worker efficiency of the
    answer's loader path (``path_name``) where measured, else the least efficient measured,
    as a measured ``Number``."""
    found = scaling_evidence(results, encoding, cores)
    base = (f"the rate per core measured on {cores} cores holds on your {user_cores:g} per "
            "accelerator: linear scaling")
    if not found:
        return base + " (the prefetch study measured no path at 1 and at " \
            f"{cores} workers here to check it)", None
    mine = [s for s in found if s.prefetcher == path_name]
    used = mine[0] if mine else found[0]
    others = [s for s in found if s is not used]
    text = (f"{base}; from 1 to {cores} workers here, {used.text} (prefetch study, the same "
            "set)" + (f"; also {'; '.join(s.text for s in others)}" if others else "")
            + ("" if user_cores <= cores else
               f"; beyond {cores} cores nothing here measures it: shared memory bandwidth "
               "and caches may bend it"))
    return text, Number(f"1- to {cores}-worker scaling, {used.label}, {used.decoder}",
                        used.efficiency, "ratio", "measured",
                        f"{format_value(used.many, 'samples/s')} over {cores} \u00d7 "
                        f"{format_value(used.one, 'samples/s')}, prefetch study; 1.0 is "
                        "linear")


def per_core_anchors(results, per_core: float, decode: str | None,
                     ref_bytes: float) -> tuple[list[Number], list[str]]:
    """The published per-core rates of JPEG pipelines on ImageNet-size images beside ours
    (``per_core`` at the measured set's ``ref_bytes``, near ImageNet's mean), raw and over
    their machines' one-core decode rate (``DECODE_ANCHOR``); ours raw and over this run's
    (``core_calibration``); and, where an anchor differs from ours by more than
    ``ANCHOR_GAP``, a note saying so and why."""
    calibration = core_calibration(results, "jpeg")
    numbers = [a.number() for a in PER_CORE_ANCHORS]
    numbers.insert(0, Number(
        f"per core at the measured set's {format_value(ref_bytes, 'bytes')}", per_core,
        "samples/s", "measured", "the measured rate over the loader's cores, before any "
        "scaling to your samples or cores"))
    if calibration is not None:
        numbers[1:1] = [calibration.number(), Number(
            "per core over one core's full decode", per_core / calibration.rate, "ratio",
            "measured", f"{format_value(per_core, 'samples/s')} over "
            f"{format_value(calibration.rate, 'samples/s')}, both this run's: the pipeline's "
            "cost against a bare decode, whatever the core's speed")]
    numbers += [Number(
        f"{a.name} over its machine's one-core decode", a.low / DECODE_ANCHOR.high, "ratio",
        "cited", f"{a.range_text}/s over {DECODE_ANCHOR.range_text}/s "
        f"({DECODE_ANCHOR.source}): {a.low / DECODE_ANCHOR.high:.2f}-"
        f"{a.high / DECODE_ANCHOR.low:.2f}") for a in PER_CORE_ANCHORS]
    far = [(a, a.low / per_core, a.high / per_core) for a in PER_CORE_ANCHORS
           if a.high / per_core > ANCHOR_GAP or a.low / per_core < 1 / ANCHOR_GAP]
    if not far:
        return numbers, []
    gaps = "; ".join(f"{a.name} {a.range_text}/s is " + (
        f"{lo:.1f}\u00d7" if lo == hi else f"{lo:.1f}-{hi:.1f}\u00d7") + " ours"
        for a, lo, hi in far)
    why = []
    if calibration is not None:
        # Each rate over its own machine's one-core rate compares the pipelines, not the
        # cores.
        tuned = PER_CORE_ANCHORS[0]
        why.append(
            f"one thread here decodes whole images ({calibration.decoder}) and crops "
            f"{format_value(calibration.rate, 'samples/s')}, where the anchors' cores decode "
            f"{DECODE_ANCHOR.range_text}/s ({DECODE_ANCHOR.source}); over that one-core "
            f"rate, ours is {per_core / calibration.rate:.2f} and the {tuned.name}'s "
            f"{tuned.low / DECODE_ANCHOR.high:.2f}-{tuned.low / DECODE_ANCHOR.low:.2f} (ours "
            "counts the crop and resize in the one-thread rate, theirs the decode alone)")
    window = decoder_rates(results, "thread/w2/")
    if decode and decode != "window" and "window" in window and decode in window:
        why.append(f"our rate decodes whole images ({decode}): crop-window decode is "
                   f"{window['window'] / window[decode]:.2f}\u00d7 through the same path "
                   "here (prefetch study)")
    if any(a is CROP_DECODE_ANCHOR for a, _, _ in far):
        why.append(f"{CROP_DECODE_ANCHOR.source} pre-resizes its images to 256-512 px, "
                   "fewer pixels than ImageNet's")
    return numbers, [f"per core at {format_value(ref_bytes, 'bytes')} a JPEG "
                     f"({format_value(per_core, 'samples/s')} here), {gaps}: "
                     f"{'; '.join(why) or 'our rows do not say why'}"]


def requests_in_flight(results, store: Choice, s: Situation) -> tuple[int, float, str]:
    """(requests in flight per node for ``BUSY_HEADROOM`` times the demand, the measured
    samples a request, the in-flight count the rows ran): Little's law, in flight = request
    rate x round trip."""
    spr = evidence_median(results, store, "samples_per_request")
    spr = spr if math.isfinite(spr) and spr >= 1 else 1.0
    requests_per_s = BUSY_HEADROOM * s.demand * s.accelerators / spr
    measured = (case_knobs(store.evidence[0][1]).get("concurrency", "an unrecorded number")
                if store.evidence else "an unrecorded number")
    return math.ceil(requests_per_s * s.rtt_ms / 1e3), spr, measured


def remedies(advice: Advice, results, *, bound: float = math.inf) -> tuple[Remedy, ...]:
    """What would take ``advice``'s feed to ``BUSY_HEADROOM`` times the demand, largest
    gain first (those that add capacity rather than speed last): from our rows where they
    measured it, else cited and marked so."""
    s = advice.situation
    target = BUSY_HEADROOM * s.demand
    found: list[Remedy] = []
    if s.images == "jpeg":
        basis = (advice.loader if s.storage == "local" and s.fits_in_ram
                 else advice.store)
        decode = basis_decoder(basis) or (advice.decoder.key if advice.decoder else None)
        path = case_knobs(advice.loader.evidence[0][1]).get("path", "thread/w2/") \
            if advice.loader.evidence else "thread/w2/"
        rates = decoder_rates(results, path)
        for faster, what in (("window", "decode only the crop window (libjpeg-turbo)"),
                             ("reduced", "decode at a reduced DCT scale")):
            if decode in rates and faster in rates and faster != decode \
                    and rates[faster] > rates[decode]:
                found.append(Remedy(
                    what, rates[faster] / rates[decode], "measured",
                    f"{format_value(rates[faster], 'samples/s')} against "
                    f"{format_value(rates[decode], 'samples/s')} with {decode}, the same "
                    f"loader path in RAM, prefetch study"))
        if "window" not in rates:
            found.append(Remedy(
                "decode only the crop window", CROP_DECODE_ANCHOR.low / advice.per_core,
                "cited", f"{CROP_DECODE_ANCHOR.what}: {CROP_DECODE_ANCHOR.range_text}/s a "
                f"thread on another machine ({CROP_DECODE_ANCHOR.source}), against "
                f"{format_value(advice.per_core, 'samples/s')} a core here"))
    if s.images != "raw":
        raw = loader_rates(guide_rows(results, "prefetch", encoding="raw"))
        if raw:
            raw_bytes = sample_bytes(results, "raw")
            found.append(Remedy(
                "store decoded 224x224 arrays instead (pre-resized, no decode in the loop)",
                raw[0].best.stat.median / advice.loader.median, "measured",
                f"{raw[0].best.label} over raw arrays against {advice.loader.label}, the "
                f"prefetch study; {format_value(raw_bytes, 'bytes')} a sample, "
                f"{raw_bytes / s.mean_bytes:.2f}\u00d7 your stored bytes, and each sample's "
                "crop is fixed at conversion"))
        found.append(Remedy(
            "decode on the GPU", GPU_DECODE_ANCHOR.low / advice.per_accelerator, "cited",
            f"{GPU_DECODE_ANCHOR.what}: {GPU_DECODE_ANCHOR.range_text}/s "
            f"({GPU_DECODE_ANCHOR.source}); frees the cores from decoding"))
    if s.storage != "local" and advice.in_flight is not None:
        found.append(Remedy(
            f"keep about {advice.in_flight:,} requests in flight per node", math.nan,
            "extrapolated",
            f"Little's law: {format_value(target * s.accelerators, 'samples/s')} a node "
            f"times {s.rtt_ms:g} ms; the rows measured {advice.store.label}"))
    if math.isfinite(bound) and bound < target * s.accelerators:
        found.append(Remedy(
            "faster storage", math.nan, "extrapolated",
            f"the node's storage bound, {format_value(bound, 'samples/s')}, is below "
            f"{format_value(target * s.accelerators, 'samples/s')}"))
    cores = math.ceil(target / advice.per_core)
    found.append(Remedy(
        f"{cores} cores per accelerator", cores / s.cores_per_accelerator, "extrapolated",
        f"{format_value(advice.per_core, 'samples/s')} a core at your sample size, "
        f"against {s.cores_per_accelerator:g} now"))
    found.append(cpu_node_remedy(advice, results))
    return tuple(sorted(found, key=lambda r: (not math.isfinite(r.gain),
                                              -r.gain if math.isfinite(r.gain) else 0)))


# Recipes whose pipeline runs its preprocessing on nodes apart from the training's: their
# measured rate per core sizes the CPU nodes where the results hold their rows.
CPU_NODE_RECIPE_PREFIX = "ray-data"


def cpu_node_rate(results, s: Situation) -> tuple[str, float, str] | None:
    """(recipe name, samples/s per core at ``s``'s sample size, where measured) of the
    fastest ``CPU_NODE_RECIPE_PREFIX`` recipe with rows of ``s``'s image kind in
    ``results``; None where none has."""
    from ..recipes import RECIPES
    from ..results import THROUGHPUT_METRICS, MissingResultError, select, stat

    cores = float(results.env.get("cpus_usable") or results.env.get("cpu_count") or 1)
    found = []
    for recipe in RECIPES.values():
        if not recipe.name.startswith(CPU_NODE_RECIPE_PREFIX) or recipe.encoding != s.images:
            continue
        for metric in THROUGHPUT_METRICS:
            rows = select(results.df, metric, prefetcher=recipe.loader, format=recipe.layout,
                          encoding=recipe.encoding)
            if rows.empty:
                continue
            study = str(rows["study"].iloc[0])
            try:
                bytes_ = sample_bytes(results, recipe.encoding)
            except MissingResultError:
                bytes_ = s.mean_bytes
            rate = stat(rows, metric).median
            found.append((recipe.name, rate / cores * bytes_ / s.mean_bytes,
                          f"{study} study, {format_value(rate, 'samples/s')} on {cores:g} "
                          "cores"))
            break
    return max(found, key=lambda f: f[1]) if found else None


def cpu_node_remedy(advice: Advice, results) -> Remedy:
    """Add N CPU-only nodes of the training nodes' cores that decode what the training
    nodes cannot (Ray Data, tf.data service): N from the gap to ``BUSY_HEADROOM`` times
    the demand over a CPU node's rate, the rate per core of a Ray Data recipe where the
    results measured one, else the answer's own; and the network the decoded samples
    need, ``DECODED_SAMPLE_BYTES`` each."""
    s = advice.situation
    gap_per_node = max(0.0, BUSY_HEADROOM * s.demand - advice.per_accelerator) * s.accelerators
    gap = gap_per_node * s.nodes
    measured = cpu_node_rate(results, s)
    if measured is not None:
        name, per_core, where = measured
        kind, source = "measured", f"{format_value(per_core, 'samples/s')} a core, {name} ({where})"
    else:
        per_core = advice.per_core
        kind = "extrapolated"
        source = (f"{format_value(per_core, 'samples/s')} a core, the answer's own rate: no "
                  f"{CPU_NODE_RECIPE_PREFIX} recipe measured, so a CPU node is assumed to "
                  "decode as fast as the training node's cores")
    nodes = max(1, math.ceil(gap / (per_core * s.cores)))
    return Remedy(
        f"add {nodes} CPU-only node(s) of {s.cores} cores to preprocess", math.nan, kind,
        f"{format_value(gap, 'samples/s')} decoded off the training nodes at {source}; "
        f"shipped as {format_value(DECODED_SAMPLE_BYTES, 'bytes')} samples (224x224x3): "
        f"{format_value(gap_per_node * DECODED_SAMPLE_BYTES / 1e6, 'MB/s')} into each "
        f"training node, {format_value(gap * DECODED_SAMPLE_BYTES / nodes / 1e6, 'MB/s')} "
        "out of each CPU node (Ray Data, tf.data service)")


@dataclass(frozen=True)
class MeasureTarget:
    """A recipe ``advise --measure`` times (``role``: "answer" or "runner-up") with the
    workers its loader path ran in the reference, and the reference's rate of the same
    path, decoder and set in RAM (the prefetch study's; the guide row's where that study
    did not run it)."""

    role: str
    recipe: object
    workers: int
    reference: float


def key_workers(key: str) -> int:
    """The workers in a loader path key (``"thread/w2/"``: 2); 0 where it names none."""
    parts = [p for p in key.split("/") if p.startswith("w") and p[1:].isdigit()]
    return int(parts[0][1:]) if parts else 0


def reference_rate(results, recipe, workers: int, fallback: float) -> float:
    """The prefetch study's median rate of ``recipe``'s loader path at ``workers`` over
    its layout with its decoder; ``fallback`` where the study did not run it."""
    table = loader_table(results, recipe.encoding)
    found = table[(table["prefetcher"] == recipe.loader)
                  & (table["dataset"] == f"{recipe.layout}-{recipe.encoding}")
                  & (table["decode"] == (recipe.decode or "none"))
                  & (table["workers"] == workers)]
    return float(found["samples_per_s"].max()) if not found.empty else fallback


def recipes_to_measure(advice: Advice, results) -> tuple[MeasureTarget, ...]:
    """The recipe the answer names and a runner-up, the ones ``advise --measure`` times:
    the loader row's runner-up with the answer's decoder, then the answer's path with the
    decoder row's runner-up, then those paths' recipes with any decoder, the first that is
    declared and not the answer's. Empty where no recipe is declared for the answer's
    loader path."""
    decode = None if advice.decoder is None else advice.decoder.key
    answer = recipe_of(advice.loader, decode)
    if answer is None:
        return ()
    if advice.loader.study == "peers":
        return _recipes_of_row(advice, answer)
    dataset = str(advice.loader.facets.get("dataset", ""))
    workers = key_workers(advice.loader.key)
    found = [MeasureTarget("answer", answer, workers,
                           reference_rate(results, answer, workers, advice.loader.median))]
    second = advice.loader.runner_up_key
    other_decode = None if advice.decoder is None else advice.decoder.runner_up_key
    tries = [(key, recipe_for(key, dataset, wanted), wanted)
             for key, wanted in ((second, decode), (advice.loader.key, other_decode))
             if key is not None]
    tries = [(key, recipe) for key, recipe, wanted in tries
             if recipe is not None and recipe.decode == wanted]
    tries += [(key, recipe) for key in (second, advice.loader.key) if key is not None
              for recipe in recipes_over(key, dataset)]
    for key, recipe in tries:
        if recipe.name == answer.name:
            continue
        fallback = advice.loader.runner_up_median if key == second else math.nan
        runs = key_workers(key) or workers
        found.append(MeasureTarget("runner-up", recipe, runs,
                                   reference_rate(results, recipe, runs, fallback)))
        break
    return tuple(found)


def _recipes_of_row(advice: Advice, answer) -> tuple[MeasureTarget, ...]:
    """The answer's recipe and the runner-up's of one recipe row (the peers study's), each
    at the row's workers, with its median in that row as the reference's rate."""
    workers = int(advice.loader.facets.get("workers", 1))
    found = [MeasureTarget("answer", answer, workers, advice.loader.median)]
    second = advice.loader.runner_up_key
    recipe = None if second is None else recipe_of(dataclasses.replace(advice.loader,
                                                                       key=second))
    if recipe is not None and recipe.name != answer.name:
        found.append(MeasureTarget("runner-up", recipe, workers,
                                   advice.loader.runner_up_median))
    return tuple(found)


def recipes_over(key: str, dataset: str) -> list:
    """Every recipe of loader path key ``key``'s path over ``dataset``, antialiased
    first."""
    from ..recipes import RECIPES

    path = next((part for part in key.split("/") if part), "")
    mine = [r for r in RECIPES.values()
            if r.loader == path and f"{r.layout}-{r.encoding}" == dataset]
    return sorted(mine, key=lambda r: r.transform.filter != "antialiased")


def measure_commands(s: Situation, dataset: Path | str | None) -> tuple[str, ...]:
    """The commands that measure the same on the user's own images."""
    target = Path(dataset) if dataset is not None else Path("data/mine")
    flags = (f"--storage {s.storage}" + (f" --rtt-ms {s.rtt_ms:g}" if s.rtt_ms is not None
                                          else "")
             + (f" --disk {s.disk}" if s.disk else "")
             + f" --ram-gb {s.ram_gb:g} --cores {s.cores} --accelerators {s.accelerators}"
             + (f" --nodes {s.nodes}" if s.nodes > 1 else "")
             + (f" --workload {s.workload}" if s.workload else f" --demand {s.demand:g}"))
    commands = [] if dataset is not None else [
        f"storebench import YOUR_IMAGE_FOLDER --out {target}"]
    return (*commands, f"storebench advise --measure --dataset {target} {flags}",
            f"storebench study --dataset {target}",
            f"storebench advise --dataset {target} --results results/{target.name} {flags}")


def situation_from(*, images: str | None = None, count: int | None = None,
                   mean_bytes: float | None = None, storage: str = "local",
                   rtt_ms: float | None = None, disk: str | None = None,
                   ram_gb: float | None = None,
                   cores: int | None = None, accelerators: int = 1, nodes: int = 1,
                   demand: float | None = None, workload: str | None = None,
                   dataset: Path | str | None = None,
                   resize: str = "antialiased") -> Situation:
    """A ``Situation`` from the command line's values: ``dataset`` fills in the image kind,
    count and mean bytes that are not given; ``workload`` the demand."""
    if demand is not None and workload is not None:
        raise AdviceError("give --demand or --workload, not both")
    if workload is not None:
        demand = get_workload(workload).samples_per_s
    given = {"images": images, "count": count, "mean_bytes": mean_bytes}
    if dataset is not None:
        given = {**dataset_situation(dataset), **{k: v for k, v in given.items()
                                                 if v is not None}}
    given |= {"ram_gb": ram_gb, "cores": cores, "demand": demand}
    flags = {"images": "--images", "count": "--count", "mean_bytes": "--mean-bytes",
             "ram_gb": "--ram-gb", "cores": "--cores", "demand": "--demand or --workload"}
    missing = [flags[k] for k, v in given.items() if v is None]
    if missing:
        raise AdviceError(f"needs {', '.join(missing)}"
                          + (" (or --dataset DIR for the images)" if dataset is None and
                             "--images" in missing else ""))
    return Situation(**given, storage=storage, rtt_ms=rtt_ms, disk=disk,
                     accelerators=accelerators,
                     nodes=nodes, workload=workload, resize=resize)


def advise_command(results_dir: Path | str, *, as_json: bool = False, **values) -> str:
    """``storebench advise``'s output: the answer as text, or as one JSON object."""
    import json

    from ..results import Results

    situation = situation_from(**values)
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise AdviceError(f"{results_dir}: no such results directory")
    answer = advise(situation, Results.load(results_dir), dataset=values.get("dataset"))
    return json.dumps(answer.to_dict(), indent=2) if as_json else answer.text()
