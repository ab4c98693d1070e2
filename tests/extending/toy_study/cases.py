"""The toy study's case function: one timed sequential pass through a dataset's reader."""

from __future__ import annotations

import numpy as np

from storebench.bench.case import Case, Trial


def sequential_pass_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    from storebench.formats import open_dataset

    with open_dataset(case.dataset, verify=False) as reader:
        count, batch = len(reader), case.batch_size or 64
        with trial.measure() as measured:
            for start in range(0, count, batch):
                reader.read_many(np.arange(start, min(start + batch, count)))
    return {"samples_per_s": (count / measured.wall_seconds, "samples/s"),
            "samples": (count, "count")}
