"""The correctness study's grid: every recipe audited over probe sets of its own."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...bench.case import Case
from ...bench.plan import plan_for
from ...recipes import RECIPES
from .cases import RANK_COUNTS, REFERENCE_WORKERS, WORKER_COUNTS

NAME = "correctness"
CASES = "storebench.studies.correctness.cases"


@dataclass(frozen=True)
class AuditSize:
    """How much a profile's audit reads: probes in the set, batch size, and the rank and
    worker counts of its exactly-once runs."""

    samples: int
    batch_size: int
    rank_counts: tuple[int, ...]
    worker_counts: tuple[int, ...]


# ci: a small set, 3 ranks (the count that does not divide the set) and 1 and 2 workers, so
# that every kind of run is exercised in seconds per recipe.
COMPACT_SIZE = AuditSize(128, 16, (3,), (1, REFERENCE_WORKERS))
FULL_SIZE = AuditSize(2048, 64, RANK_COUNTS, WORKER_COUNTS)


# On a compact plan (ci), one recipe of these engines is audited, not each: their recipes
# differ in the reader only, and each run starts the engine (a Ray node: about 10 s), so
# the ci audit of every one would take minutes. Full plans audit them all.
ENGINES_AUDITED_ONCE_WHEN_COMPACT = frozenset({"ray"})


def size_for(profile: str) -> AuditSize:
    return COMPACT_SIZE if plan_for(profile).compact else FULL_SIZE


def _joined(numbers) -> str:
    return ",".join(str(n) for n in numbers)


def grid(*, profile: str, data_dir: Path | str, repeats: int | None = None) -> list[Case]:
    """One audit case per recipe (every run its properties share, ranks included: a peer
    that reads its own files splits them with its library's own mechanism). Each case builds
    its own probe set: ``data_dir``'s sets are not read. Counts, not times: one repeat."""
    plan = plan_for(profile)
    size = size_for(profile)
    cases = []
    audited_engines = set()
    for name, recipe in RECIPES.items():
        engine = ENGINES_AUDITED_ONCE_WHEN_COMPACT & set(recipe.path.libraries)
        if plan.compact and engine & audited_engines:
            continue
        audited_engines |= engine
        params = {"recipe": name, "samples": size.samples,
                  "rank_counts": _joined(size.rank_counts),
                  "worker_counts": _joined(size.worker_counts)}
        if recipe.environment != "main":
            params["environment"] = recipe.environment
        common = {"study": NAME, "format": recipe.layout, "encoding": recipe.encoding,
                  "prefetcher": recipe.loader, "workers": REFERENCE_WORKERS,
                  "batch_size": size.batch_size, "access": "shuffle", "repeats": 1,
                  "measured_once": True,
                  "warmup": False, "timeout_s": plan.timeout_s}
        cases.append(Case(function=f"{CASES}:audit_case", params=params, **common))
    return cases
