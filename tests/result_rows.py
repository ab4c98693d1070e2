"""Synthetic result rows for the tests of the query layer, the guide, findings and figures:
schema rows whose values are chosen, so every number a sentence or figure shows can be
checked against them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from storebench.bench.schema import METRIC_UNITS, ResultsWriter, make_row, validate

RUN = "20260101T000000Z-aaaaaa"
OLDER_RUN = "20250101T000000Z-bbbbbb"


def case_rows(study: str, case_id: str, metrics: Mapping[str, Iterable[float]], *,
              run_id: str = RUN, status: str = "ok", resident: float | None = None,
              params: Mapping | None = None, profile: str = "ci", **fields) -> list[dict]:
    """Schema rows of one case: ``metrics`` maps a metric to its values, one per repeat
    (repeat 0, 1, ...)."""
    rows = []
    for metric, values in metrics.items():
        unit = METRIC_UNITS.get(metric) or ("ratio" if "fraction" in metric else "samples/s")
        for repeat, value in enumerate(values):
            rows.append(make_row(
                run_id=run_id, study=study, case_id=case_id, repeat=repeat, metric=metric,
                value=value, unit=unit, status=status,
                error="" if status == "ok" else "Traceback ...\nRuntimeError: boom",
                resident_fraction=resident, params=json.dumps(params or {}), profile=profile,
                **fields))
    return rows


def frame(*groups: list[dict]) -> pd.DataFrame:
    return validate(pd.DataFrame([row for rows in groups for row in rows]))


def write_results(directory: Path, *groups: list[dict], env: Mapping | None = None) -> Path:
    """``<directory>/<study>.csv`` per study of ``groups`` (and ``env.json``)."""
    by_study: dict[str, list[dict]] = {}
    for rows in groups:
        for row in rows:
            by_study.setdefault(row["study"], []).append(row)
    for study, rows in by_study.items():
        with ResultsWriter(directory / f"{study}.csv") as writer:
            writer.write_rows(rows)
    if env is not None:
        (directory / "env.json").write_text(json.dumps(env))
    return directory


# -- one case of each study, as its case function writes it -------------------------------
def read_case(fmt: str, cache: str, values, *, encoding: str = "raw",
              access: str = "sequential", params: Mapping | None = None) -> list[dict]:
    """A formats-study read through the Reader."""
    name = (params or {}).get("dataset_name", f"{fmt}-{encoding}")
    return case_rows("formats", f"read:{name}/{access}/{cache}", {"samples_per_s": values},
                     format=fmt, encoding=encoding, loader="reader", access=access,
                     cache=cache, batch_size=256, params=params,
                     resident=0.0 if cache == "cold" else 1.0)


def build_case(fmt: str, *, seconds: float, apparent: float, files: int,
               encoding: str = "raw", raw: float = 1_000_000) -> list[dict]:
    """A formats-study build-cost case (one repeat, from the manifest)."""
    return case_rows("formats", f"build:{fmt}-{encoding}", {
        "write_seconds": [seconds], "write_MBps": [raw / seconds / 1e6],
        "bytes_apparent": [apparent], "bytes_allocated": [apparent], "raw_bytes": [raw],
        "size_ratio": [apparent / raw], "file_count": [files],
    }, format=fmt, encoding=encoding)


def prefetch_case(prefetcher: str, workers: int, values, *, start_method: str | None = None,
                  fmt: str = "memmap", encoding: str = "raw", decode: str | None = None,
                  cpu: float = 1.0, pss: float = 50e6) -> list[dict]:
    """A prefetch-study epoch of one loader path (``values``: samples/s per repeat), with
    params as ``prefetch.grid`` writes them (a start method only where the variant names
    one)."""
    params = {"start_method": start_method} if start_method else {}
    if decode:
        params["decode"] = decode
    values = list(values)
    return case_rows(
        "prefetch", f"epoch:{fmt}-{encoding}/{prefetcher}/{workers}/{start_method}/{decode}",
        {"samples_per_s": values, "cpu_utilisation": [cpu] * len(values),
         "peak_pss_bytes": [pss] * len(values), "peak_uss_bytes": [pss / 2] * len(values)},
        format=fmt, encoding=encoding, loader="lazy", prefetcher=prefetcher, workers=workers,
        access="shuffle", cache="warm", batch_size=256, params=params)


CPU = {"device": "cpu", "emulated": True, "device_name": "cpu"}


def feed_case(prefetcher: str, workers: int, compute_ms: float, au, *,
              device: Mapping = CPU, samples_per_s: float = 100.0,
              params: Mapping | None = None) -> list[dict]:
    """A gpu_feed case: ``au`` is the accelerator utilisation per repeat (or one value for
    three repeats); the stall is split evenly between waiting for data and the copy."""
    values = list(au) if isinstance(au, list | tuple) else [au] * 3
    count = len(values)
    stall = [1 - v for v in values]
    return case_rows(
        "gpu_feed", f"feed:{prefetcher}/{workers}/{compute_ms}/{json.dumps(params or {})}",
        {"accelerator_utilisation": values, "stall_fraction": stall,
         "wait_for_data_fraction": [s / 2 for s in stall],
         "host_copy_fraction": [s / 2 for s in stall],
         "host_overhead_fraction": [0.0] * count, "h2d_GBps": [1.0] * count,
         "samples_per_s": [samples_per_s] * count},
        format="memmap", encoding="raw", loader="lazy", prefetcher=prefetcher,
        workers=workers, access="shuffle", cache="warm", batch_size=256,
        params={"compute_ms": compute_ms, **device, **(params or {})})
