"""The targets study's grid: one case per target whose dataset was built."""

from __future__ import annotations

from pathlib import Path

from ...bench.case import Case
from ...bench.stats import MIN_DECISION_REPEATS
from ..grid import batch_size_for, dataset_fields, pick, profile_datasets, repeat_fields
from .cases import TARGETS

CASES = "storebench.studies.targets.cases"


def grid(*, profile: str, data_dir: Path | str, repeats: int | None = None) -> list[Case]:
    """One case per target whose dataset was built (a target whose required format was not
    built is left out)."""
    datasets = profile_datasets(profile, data_dir)
    cases = []
    for target in TARGETS:
        wanted = target.dataset
        picked = pick(datasets, wanted.encoding, wanted.preferred)
        if picked is None or (wanted.required and picked[1]["format"] != wanted.required):
            continue
        path, manifest = picked
        cases.append(Case(
            function=f"{CASES}:target_case", summarise=f"{CASES}:summarise_target",
            loader=target.key, workers=target.workers,
            batch_size=batch_size_for(manifest["num_samples"], target.batch_size),
            access="shuffle", cache="warm", warmup=target.warmup,
            # No time budget: a target is met by its interval's lower end, so it gets every
            # repeat the width rule asks for, and all of them while the interval still holds
            # its threshold; the decision's repeats from the first pass (no top-up repeats a
            # summarised case).
            **repeat_fields(profile, repeats, budget_s=None, threshold=target.threshold,
                            minimum=MIN_DECISION_REPEATS),
            params={"target": target.key, **dict(target.params)},
            **dataset_fields("targets", path, manifest),
        ))
    return cases
