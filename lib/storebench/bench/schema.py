"""The one tidy, long-form result format: a row per (case, repeat, metric), fixed columns.

A case's description is repeated on each of its rows, so any slice of the file is
self-describing and plots need nothing but the file. Columns that do not apply to a case are
empty (strings) or missing (numbers). Failures are rows too: ``status`` says ``failed`` or
``timeout`` and ``error`` says why; ``skipped`` is a case that could not be measured on this
machine (e.g. no memory cgroup for a memory budget), ``error`` saying why.

pandas is imported where it is used: the case worker needs only the column and unit
constants, and starts faster without it.

Writing is append-only, one whole case at a time with a single write followed by fsync, so a
Ctrl-C or a crash keeps every finished case and never leaves half of one.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

# (name, kind): kind is "str", "int" (nullable), "float".
SCHEMA: tuple[tuple[str, str], ...] = (
    ("run_id", "str"),          # one invocation of the runner
    ("timestamp", "str"),       # UTC ISO-8601 time the case finished
    ("profile", "str"),         # data_gen profile the datasets come from
    ("study", "str"),
    ("case_id", "str"),         # unique within a study; the key a resumed run skips by
    ("format", "str"),
    ("encoding", "str"),
    ("loader", "str"),
    ("prefetcher", "str"),
    ("workers", "int"),
    ("batch_size", "int"),
    ("access", "str"),          # sequential, random, block_shuffle...
    ("cache", "str"),           # cold, warm, or empty when no dataset is read
    ("resident_fraction", "float"),  # of the dataset's bytes, measured just before the repeat
    ("repeat", "int"),          # 0..repeats-1; -1 for a row about the whole case
    ("metric", "str"),
    ("value", "float"),
    ("unit", "str"),
    ("status", "str"),
    ("error", "str"),
    ("params", "str"),          # JSON object of case-specific knobs
)
COLUMNS: tuple[str, ...] = tuple(name for name, _ in SCHEMA)

UNITS = ("s", "samples/s", "MB/s", "GB/s", "bytes", "ratio", "count", "IOPS")
STATUSES = ("ok", "failed", "timeout", "skipped")
CACHE_STATES = ("", "cold", "warm")
CASE_REPEAT = -1

# Units of the metrics storebench writes; a metric not listed may use any unit in UNITS.
METRIC_UNITS: dict[str, str] = {
    # how well an epoch's order is shuffled (studies.shared_cases.order_quality)
    "shuffle.storage_rank_correlation": "ratio",
    "shuffle.displacement_ratio": "ratio",
    "shuffle.distinct_blocks_per_batch": "count",
    "shuffle.uniform_distinct_blocks_per_batch": "count",
    "shuffle.distinct_blocks_ratio": "ratio",
    # added by the harness around a measured region
    "wall_seconds": "s",
    "cpu_seconds": "s",
    "cpu_user_seconds": "s",
    "cpu_system_seconds": "s",
    "peak_pss_bytes": "bytes",
    "peak_uss_bytes": "bytes",
    "peak_memory_sample_gap_s": "s",
    # the tree's peak from the kernel (bench.metrics.KernelPeak): the case's memory cgroup's
    # high-water mark (from_cgroup 1) or summed high-water RSS (0); peak_memory_reliable is
    # 0 where the region was shorter than five sampling periods of the PSS/USS peaks
    "kernel_peak_bytes": "bytes",
    "kernel_peak_from_cgroup": "count",
    "peak_memory_reliable": "count",
    # a cold repeat's residency of its dataset's files when it ended (the harness; the
    # residency it started with is the row's resident_fraction column)
    "resident_fraction_after": "ratio",
    # one per case: its whole wall time in the subprocess (also for failures)
    "case_seconds": "s",
    # reading and loading
    "samples": "count",
    "samples_per_s": "samples/s",
    "read_MBps": "MB/s",
    "file_MBps": "MB/s",
    "time_to_first_batch_s": "s",
    "epoch_seconds": "s",
    "set_epoch_seconds": "s",
    "preload_seconds": "s",
    "cpu_utilisation": "ratio",
    # the steady window of a loader case (studies.steady): what it covered, the read-ahead
    # it skipped, whether the loader's workers ran on across epochs (1) or restarted (0)
    "steady_batches": "count",
    "steady_seconds": "s",
    "steady_epochs": "count",
    "read_ahead_batches": "count",
    "persistent_workers": "count",
    # build cost, from the manifests
    "write_seconds": "s",
    "write_MBps": "MB/s",
    "bytes_apparent": "bytes",
    "bytes_allocated": "bytes",
    "raw_bytes": "bytes",
    "size_ratio": "ratio",
    "file_count": "count",
    # per-sample checksums (verify=True) over the same warm reads without
    "verify_time_ratio": "ratio",
    # feeding an accelerator
    "h2d_GBps": "GB/s",  # from the loader's memory: a pinned copy's host staging included
    "h2d_device_GBps": "GB/s",  # the device copy alone (CUDA events)
    "accelerator_utilisation": "ratio",
    "stall_fraction": "ratio",
    "wait_for_data_fraction": "ratio",
    "host_copy_fraction": "ratio",
    "host_overhead_fraction": "ratio",
    # memory budgets (bench.memory_budget; per epoch as "epoch<n>.<metric>" too)
    "k": "count",
    "budget_bytes": "bytes",
    "cgroup_limit_bytes": "bytes",
    "baseline_bytes": "bytes",
    "baseline_rss_bytes": "bytes",
    "dataset_bytes": "bytes",
    "cgroup_peak_bytes": "bytes",
    "file_cache_bytes": "bytes",
    "major_faults": "count",
    "device_read_bytes": "bytes",
    "effective_k": "ratio",
    "does_not_fit": "count",
    "preload_needed_bytes": "bytes",
    "available_bytes": "bytes",
    # performance targets (studies.targets): per repeat, then one whole-case row each
    "target_ratio": "ratio",
    "target_value": "ratio",
    "target_threshold": "ratio",
    "target_met": "count",
    "target_low": "ratio",
    "target_high": "ratio",
    # every case (bench.worker): repeats taken and the seconds they took (cache preparation
    # included), the relative half-width of the 95% bootstrap interval of its stop metric's
    # median, and its process start-up time
    "repeats_run": "count",
    "repeats_seconds": "s",
    "median_ci_halfwidth": "ratio",
    "case_startup_s": "s",
    "epoch_samples_cap": "count",
    # and the rule its repeats ran under (bench.worker.repeat_rule_metrics)
    "repeat_rule.minimum": "count",
    "repeat_rule.maximum": "count",
    "repeat_rule.halfwidth": "ratio",
    "repeat_rule.budget_s": "s",
    "repeat_rule.threshold": "ratio",
}


class SchemaError(ValueError):
    """Results do not have the fixed columns or hold values they may not."""


def make_row(**fields) -> dict:
    """A complete row: unknown names are refused, missing ones get their empty value."""
    unknown = set(fields) - set(COLUMNS)
    if unknown:
        raise SchemaError(f"unknown result column(s) {sorted(unknown)}; columns are {COLUMNS}")
    row = {}
    for name, kind in SCHEMA:
        value = fields.get(name)
        if value is None:
            value = "" if kind == "str" else (math.nan if kind == "float" else None)
        row[name] = value
    if not row["params"]:
        row["params"] = "{}"
    return row


def _is_blank(value) -> bool:
    import pandas as pd

    if value is None or value is pd.NA or (isinstance(value, str) and value == ""):
        return True
    return isinstance(value, float) and math.isnan(value)


def normalise(df: pd.DataFrame) -> pd.DataFrame:
    """Columns in schema order with their types: strings (empty, not NaN, when missing),
    nullable integers, floats. Raises SchemaError for missing or extra columns."""
    import pandas as pd

    missing = [c for c in COLUMNS if c not in df.columns]
    extra = [c for c in df.columns if c not in COLUMNS]
    if missing or extra:
        raise SchemaError(
            f"results columns differ from the schema: missing {missing}, unexpected {extra}"
        )
    out = pd.DataFrame(index=df.index)
    for name, kind in SCHEMA:
        column = df[name]
        if kind == "str":
            out[name] = column.astype(object).where(column.notna(), "").astype(str)
        else:
            cells = column.to_numpy(dtype=object)
            blank = pd.Series([_is_blank(v) for v in cells], index=df.index, dtype=bool)
            numbers = pd.to_numeric(
                pd.Series(np.where(blank, np.nan, cells), index=df.index), errors="coerce"
            )
            bad = numbers.isna() & ~blank
            if bad.any():
                rows = list(df.index[bad][:5])
                raise SchemaError(
                    f"column {name!r} holds non-numbers at rows {rows}: "
                    f"{list(column[bad][:5])}"
                )
            if kind == "int":
                fractional = numbers.notna() & (numbers != numbers.round())
                if fractional.any():
                    raise SchemaError(
                        f"column {name!r} must hold integers; rows {list(df.index[fractional][:5])}"
                        f" hold {list(numbers[fractional][:5])}"
                    )
                out[name] = numbers.astype("Int64")
            else:
                out[name] = numbers.astype("float64")
    return out.reset_index(drop=True)


def _fail(message: str, df: pd.DataFrame, mask: pd.Series, column: str) -> None:
    if mask.any():
        rows = list(df.index[mask][:5])
        values = list(df.loc[mask, column][:5])
        raise SchemaError(f"{message}: column {column!r}, rows {rows}, values {values}")


def validate(df: pd.DataFrame) -> pd.DataFrame:
    """Check every rule of the schema; returns the normalised frame, raises SchemaError
    naming the column, the first offending rows and their values."""

    df = normalise(df)
    for name in ("run_id", "study", "case_id", "metric"):
        _fail("must not be empty", df, df[name] == "", name)
    _fail(f"status must be one of {STATUSES}", df, ~df["status"].isin(STATUSES), "status")
    _fail(f"unit must be one of {UNITS}", df, ~df["unit"].isin(UNITS), "unit")
    _fail(f"cache must be one of {CACHE_STATES}", df, ~df["cache"].isin(CACHE_STATES), "cache")
    expected_units = df["metric"].map(METRIC_UNITS)
    _fail(
        "metric has the wrong unit (see METRIC_UNITS)",
        df, expected_units.notna() & (expected_units != df["unit"]), "unit",
    )
    ok = df["status"] == "ok"
    finite = np.isfinite(df["value"].to_numpy(dtype=float, na_value=np.nan))
    _fail("an ok row needs a finite value", df, ok & ~finite, "value")
    _fail("a failed row needs an error message (a skipped one too)", df,
          ~ok & (df["error"] == ""), "error")
    fraction = df["resident_fraction"]
    _fail(
        "resident_fraction must be within [0, 1]",
        df, fraction.notna() & ((fraction < 0) | (fraction > 1)), "resident_fraction",
    )
    _fail("repeat must be -1 (whole case) or >= 0", df,
          (df["repeat"].isna() | (df["repeat"] < CASE_REPEAT)).astype(bool), "repeat")
    for name in ("workers", "batch_size"):
        _fail("must be empty or >= 0", df, (df[name].notna() & (df[name] < 0)).astype(bool),
              name)

    def not_object(text: str) -> bool:
        try:
            return not isinstance(json.loads(text), dict)
        except ValueError:
            return True

    _fail("params must be a JSON object", df, df["params"].map(not_object).astype(bool),
          "params")
    duplicated = df.duplicated(["run_id", "study", "case_id", "repeat", "metric"], keep=False)
    _fail("a (run_id, study, case_id, repeat, metric) appears twice", df, duplicated, "case_id")
    return df


def read_results(path: Path | str) -> pd.DataFrame:
    """A results CSV, normalised and validated (SchemaError names the file)."""
    import pandas as pd

    path = Path(path)
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    try:
        return validate(raw)
    except SchemaError as err:
        raise SchemaError(f"{path}: {err}") from err


def read_all_results(results_dir: Path | str) -> pd.DataFrame:
    """Every ``*.csv`` results file in ``results_dir``, concatenated (an empty frame when
    the directory has none), gzipped ones (``*.csv.gz``, as stored runs keep them) too; a
    missing directory raises ``FileNotFoundError`` naming it, and one study in both forms
    raises ``SchemaError`` (its rows would count twice)."""
    import pandas as pd

    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"{results_dir}: no such results directory")
    plain, gzipped = sorted(results_dir.glob("*.csv")), sorted(results_dir.glob("*.csv.gz"))
    twice = sorted({p.name for p in plain} & {p.name.removesuffix(".gz") for p in gzipped})
    if twice:
        raise SchemaError(f"{results_dir}: {', '.join(twice)} is there both plain and gzipped; "
                          "keep one")
    paths = plain + gzipped
    frames = [read_results(p) for p in paths]
    if not frames:
        return validate(pd.DataFrame(columns=list(COLUMNS)))
    return pd.concat(frames, ignore_index=True)


def _csv_text(rows: Iterable[Mapping]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for row in rows:
        cells = []
        for name in COLUMNS:
            value = row[name]
            if value is None or (isinstance(value, float) and math.isnan(value)):
                value = ""
            elif isinstance(value, float):
                value = repr(value)
            cells.append(value)
        writer.writerow(cells)
    return buffer.getvalue()


class ResultsWriter:
    """Appends validated rows to a results CSV, one case per call.

    The header is written once, when the file is new. An existing file must carry the same
    header; a torn last line (a writer killed mid-write) is cut off on open.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._file = None

    def __enter__(self) -> ResultsWriter:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        header = ",".join(COLUMNS) + "\n"
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as f:
                first = f.readline().decode()
            if first != header:
                raise SchemaError(
                    f"{self.path}: existing header {first.strip()!r} differs from the schema "
                    f"{header.strip()!r}; move the old file away"
                )
            _cut_torn_tail(self.path)
            self._file = open(self.path, "a", newline="")  # noqa: SIM115 - held until close
        else:
            self._file = open(self.path, "w", newline="")  # noqa: SIM115
            self._write(header)

    def write_rows(self, rows: Iterable[Mapping]) -> int:
        import pandas as pd

        rows = [make_row(**row) for row in rows]
        if not rows:
            return 0
        validate(pd.DataFrame(rows, columns=list(COLUMNS)))
        self._write(_csv_text(rows))
        return len(rows)

    def _write(self, text: str) -> None:
        if self._file is None:
            raise RuntimeError(f"{self.path}: ResultsWriter is not open")
        self._file.write(text)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _cut_torn_tail(path: Path) -> None:
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        # Walk back to the last complete line.
        position = size
        while position > 0:
            step = min(65536, position)
            f.seek(position - step)
            chunk = f.read(step)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                f.truncate(position - step + newline + 1)
                return
            position -= step
        f.truncate(0)


def finished_case_ids(path: Path | str) -> set[str]:
    """Case ids that already have rows (any status) in a results file."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return set()
    with open(path, newline="") as f:
        return {row["case_id"] for row in csv.DictReader(f) if row.get("case_id")}


def recorded_epoch_samples(path: Path | str) -> dict[str, int | None]:
    """Per case id whose worker finished (a ``repeats_run`` row), the ``epoch_samples_cap``
    its epochs were read under, None for whole epochs: what a resumed run must match."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return {}
    finished: set[str] = set()
    caps: dict[str, int] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("metric") == "repeats_run":
                finished.add(row["case_id"])
            elif row.get("metric") == "epoch_samples_cap":
                caps[row["case_id"]] = int(float(row["value"]))
    return {case_id: caps.get(case_id) for case_id in finished}
