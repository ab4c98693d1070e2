"""Findings computed from results: summary tables and sentences whose every number is
formatted from the data.

Pure functions of results DataFrames (the long form ``bench.schema.read_results`` returns)
and of env.json's dict, so that no number in a notebook's prose or in the README is typed by
hand. Conventions:

- a case's figure is the **median over its ok timed repeats** (``repeat >= 0``); the spread
  is min to max and ``n`` the number of repeats;
- when a results file holds several runs of the same case (a resumed or repeated study), the
  latest run of each case is used, so one case never mixes runs;
- ratios of two paths measured in the same case (the ``targets`` study) are taken repeat by
  repeat and then the median, so both sides of a ratio come from the same moment.

The notebooks display these; ``readme_findings_table(results_dir)`` renders the README's
findings table from a results directory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ENCODING_ORDER = ("raw", "png", "jpeg")
ENCODING_NAMES = {"raw": "raw arrays", "png": "PNG", "jpeg": "JPEG"}
# MLPerf Storage counts a run as keeping the accelerator fed at >= 90% utilisation.
AU_THRESHOLD = 0.9
MULTIPLY = "\u00d7"
DASH = "\u2013"


class MissingResultError(LookupError):
    """The results hold no ok row for what a finding needs."""


# -- formatting ------------------------------------------------------------------------------
def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _sig(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant figures, without exponent notation."""
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(digits - 1 - magnitude, 0)
    return f"{round(value, decimals):,.{decimals}f}"


def _num(value: float) -> str:
    """A grid value as typed: ``2.0`` -> ``"2"``, ``0.5`` -> ``"0.5"``."""
    return f"{float(value):g}"


def _si(value: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return _sig(value / factor) + suffix
    return _sig(value)


def format_ratio(ratio: float) -> str:
    """``2.0`` -> ``"2.0×"``; ten and more without decimals (``"230×"``); below one to two
    significant figures (``"0.25×"``)."""
    if not _finite(ratio):
        return "n/a"
    if abs(ratio) >= 10:
        return f"{ratio:,.0f}{MULTIPLY}"
    if abs(ratio) < 1:
        return f"{_sig(ratio, 2)}{MULTIPLY}"
    return f"{ratio:.1f}{MULTIPLY}"


def relative_text(ratio: float) -> str:
    """How a throughput compares: ``2.0`` -> ``"2.0× faster than"``, ``0.5`` ->
    ``"2.0× slower than"``."""
    if not _finite(ratio) or ratio <= 0:
        return "not comparable with"
    if ratio >= 1:
        return f"{format_ratio(ratio)} faster than"
    return f"{format_ratio(1 / ratio)} slower than"


def format_percent(fraction: float) -> str:
    """``0.873`` -> ``"87%"``; below 1% with one decimal."""
    if not _finite(fraction):
        return "n/a"
    percent = 100 * fraction
    if 0 < abs(percent) < 0.1:
        return "<0.1%"
    if 0 < abs(percent) < 1:
        return f"{percent:.1f}%"
    return f"{percent:.0f}%"


def signed_bytes(value: float) -> str:
    """``+1.2 MB`` / ``-57.3 kB``: a difference in bytes with its sign."""
    if not _finite(value):
        return "n/a"
    return ("+" if value >= 0 else "-") + format_value(abs(value), "bytes")


def format_value(value: float, unit: str) -> str:
    """A value in one of the schema's units, to three significant figures with a readable
    prefix: ``format_value(1234.0, "samples/s") == "1.23k samples/s"``."""
    if not _finite(value):
        return "n/a"
    value = float(value)
    if unit == "bytes":
        for factor, suffix in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if abs(value) >= factor:
                return f"{_sig(value / factor)} {suffix}"
        return f"{value:.0f} B"
    if unit == "s":
        if value == 0:
            return "0 s"
        if abs(value) < 1e-3:
            return f"{_sig(value * 1e6)} \u00b5s"
        if abs(value) < 1:
            return f"{_sig(value * 1e3)} ms"
        return f"{_sig(value)} s"
    if unit == "MB/s":
        return f"{_sig(value / 1e3)} GB/s" if abs(value) >= 1e3 else f"{_sig(value)} MB/s"
    if unit == "GB/s":
        return f"{_sig(value)} GB/s"
    if unit in ("samples/s", "IOPS"):
        return f"{_si(value)} {unit}"
    if unit == "count":
        return f"{value:,.0f}"
    if unit == "ratio":
        return _sig(value)
    return f"{_sig(value)} {unit}".strip()


# -- selecting and summarising -----------------------------------------------------------------
def latest_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Only each case's latest run (run ids sort by their UTC start time)."""
    if df.empty:
        return df
    latest = df.groupby(["study", "case_id"])["run_id"].transform("max")
    return df[df["run_id"] == latest]


def with_params(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` plus a ``param_<name>`` column per key of the ``params`` JSON objects."""
    parsed = df["params"].map(json.loads)
    out = df.copy()
    for name in sorted({name for params in parsed for name in params}):
        out[f"param_{name}"] = parsed.map(lambda p, name=name: p.get(name))
    return out


def select(df: pd.DataFrame, metric: str | None = None, **where) -> pd.DataFrame:
    """The ok timed-repeat rows of ``metric`` whose columns equal ``where``'s values;
    ``param_<name>=value`` matches a key of the params JSON (``None``: key absent)."""
    rows = latest_runs(df)
    rows = rows[(rows["status"] == "ok") & (rows["repeat"] >= 0).fillna(False)]
    if metric is not None:
        rows = rows[rows["metric"] == metric]
    params = {k: v for k, v in where.items() if k.startswith("param_")}
    for column, value in where.items():
        if column in params:
            continue
        if column not in rows.columns:
            raise KeyError(f"no result column {column!r}; columns are {list(rows.columns)}")
        rows = rows[(rows[column] == value).fillna(False)]
    if params:
        parsed = rows["params"].map(json.loads)
        for key, value in params.items():
            name = key.removeprefix("param_")
            rows = rows[parsed.map(lambda p, name=name, value=value: p.get(name) == value)]
            parsed = parsed[rows.index]
    return rows


@dataclass(frozen=True)
class Stat:
    """A case's figure: median, min and max over ``count`` repeats, in ``unit``."""

    median: float
    low: float
    high: float
    count: int
    unit: str

    def __str__(self) -> str:
        return format_value(self.median, self.unit)

    @property
    def spread(self) -> str:
        """``"1.1k–1.3k samples/s"``-style range of the repeats."""
        low = format_value(self.low, self.unit)
        high = format_value(self.high, self.unit)
        return f"{low}{DASH}{high}"


def stat(df: pd.DataFrame, metric: str, **where) -> Stat:
    """The median, min and max of ``metric`` over the matching rows; raises
    ``MissingResultError`` naming the metric and the filter when there are none."""
    rows = select(df, metric, **where)
    if rows.empty:
        described = ", ".join(f"{k}={v!r}" for k, v in where.items())
        raise MissingResultError(f"no ok result for {metric}" + (f" with {described}" if
                                                                 described else ""))
    values = rows["value"].astype(float)
    return Stat(float(values.median()), float(values.min()), float(values.max()),
                int(values.size), str(rows["unit"].iloc[0]))


def summary_table(df: pd.DataFrame, metric: str, by: Sequence[str]) -> pd.DataFrame:
    """Per group of ``by`` columns: median, low, high, repeats of ``metric`` and the median
    resident fraction the repeats started with."""
    rows = select(df, metric)
    columns = [*by, "median", "low", "high", "repeats", "resident_fraction"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    grouped = rows.groupby(list(by), dropna=False, sort=False)
    table = grouped["value"].agg(median="median", low="min", high="max", repeats="count")
    table["resident_fraction"] = grouped["resident_fraction"].median()
    return table.reset_index()[columns]


def _format_order() -> list[str]:
    from storebench.formats import FORMATS

    return list(FORMATS)


def _sort(table: pd.DataFrame) -> pd.DataFrame:
    """Rows in encoding order, then the formats registry's order, then as they came."""
    if table.empty:
        return table
    keys = {}
    if "encoding" in table:
        keys["encoding"] = {name: i for i, name in enumerate(ENCODING_ORDER)}
    if "format" in table:
        keys["format"] = {name: i for i, name in enumerate(_format_order())}
    ranked = table.assign(**{f"_rank_{c}": table[c].map(lambda v, o=o: o.get(v, len(o)))
                             for c, o in keys.items()})
    ranked = ranked.sort_values([f"_rank_{c}" for c in keys], kind="stable")
    return ranked.drop(columns=[f"_rank_{c}" for c in keys]).reset_index(drop=True)


def markdown_table(table: pd.DataFrame,
                   formatters: Mapping[str, Callable[[object], str]] | None = None) -> str:
    """A GitHub-flavoured markdown table; ``formatters`` turn a column's cells into text."""
    formatters = dict(formatters or {})
    header = [str(c) for c in table.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for _, row in table.iterrows():
        cells = []
        for column in table.columns:
            value = row[column]
            text = formatters[column](value) if column in formatters else (
                "" if value is None or (isinstance(value, float) and math.isnan(value))
                else str(value))
            cells.append(text.replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bullets(sentences: Iterable[str]) -> str:
    """Markdown bullet list."""
    return "\n".join(f"- {s}" for s in sentences)


def repeats_text(*stats: Stat) -> str:
    counts = sorted({s.count for s in stats})
    if len(counts) == 1:
        return f"median of {counts[0]} repeat{'s' if counts[0] != 1 else ''}"
    return "medians of " + " and ".join(str(c) for c in counts) + " repeats"


def faster_sentence(subject: str, other: str, subject_stat: Stat, other_stat: Stat, *,
                    verb: str = "reads", condition: str = "") -> str:
    """``"memmap reads 2.0× faster than rawfiles warm (median of 5 repeats: 2k vs 1k
    samples/s)"``, for a metric where higher is better; says "slower" when it is."""
    comparison = relative_text(subject_stat.median / other_stat.median)
    condition = f" {condition}" if condition else ""
    return (f"{subject} {verb} {comparison} {other}{condition} "
            f"({repeats_text(subject_stat, other_stat)}: {subject_stat} vs {other_stat})")


def _best(table: pd.DataFrame, column: str = "median", *, lowest: bool = False) -> pd.Series:
    index = table[column].idxmin() if lowest else table[column].idxmax()
    return table.loc[index]


# -- 01: storage formats ---------------------------------------------------------------------
BUILD_METRICS = ("write_seconds", "write_MBps", "bytes_apparent", "bytes_allocated",
                 "raw_bytes", "size_ratio", "file_count")


def _dataset_names(df: pd.DataFrame) -> pd.Series:
    """The dataset directory a row is about: ``<format>-<encoding>`` or a variant's name."""
    named = df["params"].map(lambda text: json.loads(text).get("dataset_name"))
    default = df["format"] + "-" + df["encoding"]
    return named.where(named.notna(), default).astype(str)


def default_builds(df: pd.DataFrame) -> pd.DataFrame:
    """Rows about default builds only (no knob variant's ``dataset_name`` in params)."""
    if df.empty:
        return df
    return df[df["params"].map(lambda text: "dataset_name" not in json.loads(text))]


def build_cost_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per built dataset: write time and rate, bytes apparent and allocated, bytes
    on disk relative to the raw pixels, and file count."""
    rows = select(df[df["study"] == "formats"])
    rows = rows[rows["metric"].isin(BUILD_METRICS)]
    if rows.empty:
        return pd.DataFrame(columns=["encoding", "format", "dataset", *BUILD_METRICS])
    rows = rows.assign(dataset=_dataset_names(rows))
    table = rows.pivot_table(index=["encoding", "format", "dataset"], columns="metric",
                             values="value", aggfunc="median").reset_index()
    table.columns.name = None
    for metric in BUILD_METRICS:
        if metric not in table:
            table[metric] = np.nan
    return _sort(table[["encoding", "format", "dataset", *BUILD_METRICS]])


def cold_warm_table(df: pd.DataFrame, *, metric: str = "samples_per_s",
                    study: str = "formats", loader: str | None = "reader",
                    access: str | None = "sequential") -> pd.DataFrame:
    """Per dataset (knob variants included, by name): ``metric`` cold and warm (medians),
    warm/cold, the resident fraction each started with, and the repeats."""
    rows = df[df["study"] == study]
    if loader is not None:
        rows = rows[rows["loader"] == loader]
    if access is not None:
        rows = rows[rows["access"] == access]
    rows = rows.assign(dataset=_dataset_names(rows))
    summary = summary_table(rows, metric, ["encoding", "format", "dataset", "cache"])
    columns = ["encoding", "format", "dataset", "cold", "warm", "warm_over_cold",
               "cold_resident", "warm_resident", "repeats"]
    if summary.empty:
        return pd.DataFrame(columns=columns)
    values = summary.pivot_table(index=["encoding", "format", "dataset"], columns="cache",
                                 values="median")
    resident = summary.pivot_table(index=["encoding", "format", "dataset"], columns="cache",
                                   values="resident_fraction")
    repeats = summary.groupby(["encoding", "format", "dataset"])["repeats"].min()
    table = pd.DataFrame({
        "cold": values.get("cold"), "warm": values.get("warm"),
        "cold_resident": resident.get("cold"), "warm_resident": resident.get("warm"),
        "repeats": repeats,
    }).reset_index()
    table["warm_over_cold"] = table["warm"] / table["cold"]
    return _sort(table[columns])


def formats_findings(df: pd.DataFrame) -> list[str]:
    """Sentences on build cost and sequential reads, per encoding, from the formats study."""
    sentences = []
    # Formats are compared as built by default; the knob variants have their own findings.
    df = default_builds(df)
    build = build_cost_table(df)
    reads = cold_warm_table(df)
    raw_size = {}
    for encoding in [e for e in ENCODING_ORDER if e in set(build["encoding"])]:
        part = build[build["encoding"] == encoding]
        name = ENCODING_NAMES.get(encoding, encoding)
        small = _best(part, "size_ratio", lowest=True)
        large = _best(part, "size_ratio")
        raw_size[encoding] = small
        sentences.append(
            f"{name}: smallest on disk is {small['format']} at "
            f"{_sig(small['size_ratio'])}{MULTIPLY} the raw pixel bytes "
            f"({format_value(small['bytes_apparent'], 'bytes')}); largest is {large['format']} "
            f"at {_sig(large['size_ratio'])}{MULTIPLY} "
            f"({format_value(large['bytes_apparent'], 'bytes')})."
        )
        fast = _best(part, "write_seconds", lowest=True)
        slow = _best(part, "write_seconds")
        sentences.append(
            f"{name}: fastest to write is {fast['format']} "
            f"({format_value(fast['write_seconds'], 's')}, "
            f"{format_value(fast['write_MBps'], 'MB/s')} of raw pixels); slowest is "
            f"{slow['format']} ({format_value(slow['write_seconds'], 's')}, "
            f"{format_ratio(slow['write_seconds'] / fast['write_seconds'])} longer)."
        )
        many = _best(part, "file_count")
        few = _best(part, "file_count", lowest=True)
        overhead = part["bytes_allocated"] / part["bytes_apparent"]
        worst = part.loc[overhead.idxmax()]
        sentences.append(
            f"{name}: {many['format']} writes {format_value(many['file_count'], 'count')} "
            f"files, {few['format']} {format_value(few['file_count'], 'count')}; "
            f"{worst['format']} allocates the most beyond its apparent size "
            f"({_sig(overhead.max())}{MULTIPLY} its apparent bytes)."
        )
        readings = reads[reads["encoding"] == encoding].dropna(subset=["warm"])
        cold = readings.dropna(subset=["cold"])
        for cache, rows, condition in (("warm", readings, "warm, sequentially"),
                                       ("cold", cold, "cold")):
            if len(rows) < 2:
                continue
            best = _best(rows, cache)
            worst_read = _best(rows, cache, lowest=True)
            where = {"study": "formats", "loader": "reader", "encoding": encoding,
                     "cache": cache}
            sentence = name + ": " + faster_sentence(
                best["format"], worst_read["format"],
                stat(df, "samples_per_s", format=best["format"], **where),
                stat(df, "samples_per_s", format=worst_read["format"], **where),
                condition=condition)
            if cache == "cold":
                sentence += (
                    f"; cold repeats started with at most "
                    f"{format_percent(cold['cold_resident'].max())} of the files resident, "
                    f"warm ones with at least {format_percent(readings['warm_resident'].min())}"
                )
            sentences.append(sentence + ".")
    if "raw" in raw_size:
        base = raw_size["raw"]["size_ratio"]
        for encoding in ("png", "jpeg"):
            if encoding in raw_size:
                sentences.append(
                    f"Stored as {ENCODING_NAMES[encoding]}, samples take "
                    f"{format_percent(raw_size[encoding]['size_ratio'] / base)} of the bytes "
                    f"of the smallest raw layout ({raw_size[encoding]['format']}, "
                    f"{raw_size['raw']['format']})."
                )
    return sentences


def knobs_table(formats: Mapping[str, object]) -> pd.DataFrame:
    """Each format's build knobs (with defaults) and open options, from the registry."""
    rows = []
    for name, module in formats.items():
        knobs = getattr(module, "DEFAULT_KNOBS", {})
        rows.append({
            "format": name,
            "encodings": ", ".join(getattr(module, "ENCODINGS", ())),
            "build knobs (default)": ", ".join(f"{k}={v!r}" for k, v in knobs.items()) or "none",
            "open options": ", ".join(getattr(module, "OPEN_OPTIONS", ())) or "none",
        })
    return pd.DataFrame(rows)


def knob_settings(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (formats rows) plus ``dataset``, ``knob`` and ``setting`` columns: for a variant
    its knob and value from params; for a default build of a format that has variants, each
    varied knob at its default (from the formats registry), so both sides of a knob compare.
    A default build appears once per knob varied."""
    from storebench.formats import get_format

    rows = df[df["study"] == "formats"]
    if rows.empty:
        return rows.assign(dataset=[], knob=[], setting=[])
    params = rows["params"].map(json.loads)
    rows = rows.assign(dataset=_dataset_names(rows))
    knobs = params.map(lambda p: [(k.removeprefix("knob_"), v) for k, v in p.items()
                                  if k.startswith("knob_")])
    variants = rows[knobs.map(bool)]
    varied = {(f, e, k) for f, e, ks in zip(variants["format"], variants["encoding"],
                                            knobs[variants.index]) for k, _ in ks}
    parts = [variants.assign(knob=knobs[variants.index].map(lambda ks: ks[0][0]),
                             setting=knobs[variants.index].map(lambda ks: str(ks[0][1])))]
    defaults = rows[~knobs.map(bool)]
    for fmt, encoding, knob in sorted(varied):
        base = defaults[(defaults["format"] == fmt) & (defaults["encoding"] == encoding)]
        value = get_format(fmt).DEFAULT_KNOBS.get(knob)
        parts.append(base.assign(knob=knob, setting=f"{value} (default)"))
    return pd.concat(parts, ignore_index=True)


def setting_rank(setting: str) -> tuple:
    """Numeric knob settings in numeric order (``"64 (default)"`` between 1 and 1024), then
    the rest with the default first."""
    head = str(setting).split(" ")[0]
    try:
        return (0, float(head), "")
    except ValueError:
        return (1, 0.0 if "(default)" in str(setting) else 1.0, str(setting))


KNOB_METRICS = (("size_ratio", None, None), ("write_seconds", None, None),
                ("samples_per_s", "sequential", "warm"), ("samples_per_s", "sequential", "cold"),
                ("samples_per_s", "shuffle", "cold"), ("samples_per_s", "shuffle", "warm"))


def knob_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per format, encoding, knob and setting: bytes on disk over raw, write time, and
    samples/s of sequential reads (warm, cold) and random batches (cold, and warm when
    measured): medians."""
    rows = knob_settings(select(df))
    keys = ["format", "encoding", "knob", "setting"]
    names = {("samples_per_s", "sequential", "warm"): "sequential_warm",
             ("samples_per_s", "sequential", "cold"): "sequential_cold",
             ("samples_per_s", "shuffle", "cold"): "random_cold",
             ("samples_per_s", "shuffle", "warm"): "random_warm"}
    columns = [*keys, "size_ratio", "write_seconds", *names.values()]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame(index=pd.MultiIndex.from_frame(rows[keys].drop_duplicates()))
    for metric, access, cache in KNOB_METRICS:
        part = rows[rows["metric"] == metric]
        if access is not None:
            part = part[(part["access"] == access) & (part["cache"] == cache)]
        column = names.get((metric, access, cache), metric)
        table[column] = part.groupby(keys)["value"].median()
    table = table.reset_index()
    for column in columns:
        if column not in table:
            table[column] = np.nan
    table = table.sort_values("setting", key=lambda c: c.map(setting_rank), kind="stable")
    return _sort(table.sort_values(["format", "encoding", "knob"], kind="stable"))[columns]


KNOB_EFFECTS = {
    "chunk_samples": ("random_cold", "random batches, cold"),
    "row_group_size": ("random_cold", "random batches, cold"),
    "compression": ("size_ratio", "bytes on disk / raw bytes"),
    "num_shards": ("sequential_cold", "a cold sequential read"),
}


def knob_findings(df: pd.DataFrame) -> list[str]:
    """Per varied knob: its settings on the figure that knob is about (``KNOB_EFFECTS``),
    plus sequential warm reads, all from the formats study."""
    table = knob_table(df)
    sentences = []
    for (fmt, encoding, knob), part in table.groupby(["format", "encoding", "knob"],
                                                     sort=False):
        column, what = KNOB_EFFECTS.get(knob, ("sequential_warm", "sequential reads, warm"))
        unit = "ratio" if column == "size_ratio" else "samples/s"
        shown = part.dropna(subset=[column])
        if len(shown) < 2:
            continue
        values = "; ".join(
            f"{row['setting']}: {format_value(row[column], unit)}"
            + (f"{MULTIPLY}" if unit == "ratio" else "") for _, row in shown.iterrows())
        text = f"{fmt} ({ENCODING_NAMES.get(encoding, encoding)}) {knob}, {what}: {values}"
        warm = part.dropna(subset=["sequential_warm"])
        if column != "sequential_warm" and len(warm) >= 2:
            fast, slow = _best(warm, "sequential_warm"), _best(warm, "sequential_warm",
                                                               lowest=True)
            text += (f"; sequential warm reads are fastest with {fast['setting']}, "
                     f"{format_ratio(fast['sequential_warm'] / slow['sequential_warm'])} "
                     f"those with {slow['setting']}")
        sentences.append(text + ".")
    return sentences


# -- 02: lazy vs preloaded -------------------------------------------------------------------
LOADER_METRICS = ("samples_per_s", "time_to_first_batch_s", "preload_seconds",
                  "peak_pss_bytes", "peak_uss_bytes")


def loader_table(df: pd.DataFrame, *, study: str = "lazy_vs_preloaded") -> pd.DataFrame:
    """Per dataset, loader, access order and cache state: medians of throughput, time to
    first batch, preload time, peak PSS and USS; the resident fraction at start; repeats."""
    rows = default_open(df[df["study"] == study])
    keys = ["encoding", "format", "loader", "access", "cache"]
    tables = []
    for metric in LOADER_METRICS:
        part = summary_table(rows, metric, keys)
        if part.empty:
            continue
        tables.append(part.set_index(keys)[["median"]].rename(columns={"median": metric}))
    if not tables:
        return pd.DataFrame(columns=[*keys, *LOADER_METRICS, "resident_fraction", "repeats"])
    basis = summary_table(rows, "samples_per_s", keys).set_index(keys)
    table = pd.concat(tables, axis=1)
    table["resident_fraction"] = basis["resident_fraction"]
    table["repeats"] = basis["repeats"]
    return _sort(table.reset_index())


def open_options(params: str) -> dict:
    """The ``open_<option>`` params of a row (format open options a case chose)."""
    return {k.removeprefix("open_"): v for k, v in json.loads(params).items()
            if k.startswith("open_")}


def default_open(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of cases that opened their dataset with the format's default options."""
    if df.empty:
        return df
    return df[df["params"].map(lambda text: not open_options(text))]


def failed_cases(df: pd.DataFrame, *, study: str | None = None) -> pd.DataFrame:
    """Cases whose latest run failed or timed out, with the first line of the error."""
    rows = latest_runs(df)
    if study is not None:
        rows = rows[rows["study"] == study]
    rows = rows[rows["status"] != "ok"].drop_duplicates(["study", "case_id"])
    errors = rows["error"].map(lambda text: text.strip().splitlines()[-1] if text.strip() else "")
    return rows.assign(error=errors)[["study", "case_id", "status", "error"]].reset_index(
        drop=True)


def lazy_vs_preloaded_findings(df: pd.DataFrame, env: Mapping | None = None, *,
                               profile_bytes: Mapping[str, int] | None = None) -> list[str]:
    """Sentences on preloading vs reading per access, warm and cold, and on how close the
    datasets came to RAM (``env["ram_bytes"]``; ``profile_bytes``: raw bytes of profiles the
    results did not measure, e.g. the opt-in large one)."""
    table = loader_table(df)
    # Every dataset was read block-shuffled by both loaders: compare loaders in that order.
    table = table[table["access"] == "block_shuffle"]
    sentences = []
    for encoding in [e for e in ENCODING_ORDER if e in set(table["encoding"])]:
        name = ENCODING_NAMES.get(encoding, encoding)
        part = table[table["encoding"] == encoding]
        warm = part[part["cache"] == "warm"].pivot_table(
            index="format", columns="loader", values="samples_per_s")
        if {"lazy", "preloaded"} <= set(warm.columns):
            gain = (warm["preloaded"] / warm["lazy"]).dropna()
            if not gain.empty:
                most, least = gain.idxmax(), gain.idxmin()
                sentences.append(
                    f"{name}, warm: the preloaded epoch runs {format_ratio(gain[most])} the lazy "
                    f"one's throughput on {most} and {format_ratio(gain[least])} on {least} "
                    f"({format_value(warm.loc[most, 'preloaded'], 'samples/s')} vs "
                    f"{format_value(warm.loc[most, 'lazy'], 'samples/s')} on {most})."
                )
        cold = part[part["cache"] == "cold"].pivot_table(
            index="format", columns="loader",
            values=["time_to_first_batch_s", "peak_pss_bytes", "samples_per_s"])
        if ("time_to_first_batch_s", "preloaded") in cold and (
                "time_to_first_batch_s", "lazy") in cold:
            first = cold["time_to_first_batch_s"]
            slowest = (first["preloaded"] / first["lazy"]).idxmax()
            sentences.append(
                f"{name}, cold: preloading delays the first batch to "
                f"{format_value(first.loc[slowest, 'preloaded'], 's')} on {slowest} against "
                f"{format_value(first.loc[slowest, 'lazy'], 's')} when reading lazily "
                f"({format_ratio(first.loc[slowest, 'preloaded'] / first.loc[slowest, 'lazy'])})."
            )
        memory = part.pivot_table(index="format", columns="loader",
                                  values=["peak_pss_bytes", "peak_uss_bytes"], aggfunc="median")
        if ("peak_pss_bytes", "preloaded") in memory and ("peak_pss_bytes", "lazy") in memory:
            pss, uss = memory["peak_pss_bytes"], memory["peak_uss_bytes"]
            extra = (pss["preloaded"] - pss["lazy"]).median()
            build = build_cost_table(df)
            on_disk = build.loc[build["encoding"] == encoding, "bytes_apparent"].median()
            size_note = (f", against {format_value(on_disk, 'bytes')} of data on disk"
                         if _finite(on_disk) else "")
            sentences.append(
                f"{name}: peak PSS of the whole process tree is "
                f"{format_value(pss['preloaded'].median(), 'bytes')} preloaded and "
                f"{format_value(pss['lazy'].median(), 'bytes')} lazy (USS "
                f"{format_value(uss['preloaded'].median(), 'bytes')} and "
                f"{format_value(uss['lazy'].median(), 'bytes')}; medians over formats): "
                f"preloaded minus lazy is {signed_bytes(extra)}{size_note}."
            )
        lazy = part[part["loader"] == "lazy"].pivot_table(
            index="format", columns="cache", values=["samples_per_s", "resident_fraction"])
        if ("samples_per_s", "cold") in lazy and ("samples_per_s", "warm") in lazy:
            penalty = (lazy[("samples_per_s", "warm")] / lazy[("samples_per_s", "cold")]).dropna()
            if not penalty.empty:
                worst = penalty.idxmax()
                sentences.append(
                    f"{name}: a cold cache costs lazy reading most on {worst} "
                    f"({format_ratio(penalty[worst])} slower than warm) and least on "
                    f"{penalty.idxmin()} ({format_ratio(penalty.min())}); cold repeats started "
                    f"with at most {format_percent(lazy[('resident_fraction', 'cold')].max())} "
                    f"of the files resident, warm ones with at least "
                    f"{format_percent(lazy[('resident_fraction', 'warm')].min())}."
                )
    sentences += access_order_findings(df)
    sentences += readahead_findings(df)
    sentences += ram_findings(df, env, profile_bytes=profile_bytes)
    failures = failed_cases(df, study="lazy_vs_preloaded")
    if not failures.empty:
        sentences.append(
            f"{len(failures)} case(s) failed, e.g. {failures['case_id'].iloc[0]}: "
            f"{failures['error'].iloc[0]}")
    return sentences


def ram_findings(df: pd.DataFrame, env: Mapping | None, *,
                 profile_bytes: Mapping[str, int] | None = None) -> list[str]:
    """How close the measured datasets came to the machine's RAM, stated from the data."""
    build = build_cost_table(df)
    if build.empty or not env or not env.get("ram_bytes"):
        return []
    ram = float(env["ram_bytes"])
    largest = build.loc[build["bytes_apparent"].idxmax()]
    fraction = largest["bytes_apparent"] / ram
    sentences = [
        f"The largest dataset measured is {largest['dataset']} at "
        f"{format_value(largest['bytes_apparent'], 'bytes')}, {format_percent(fraction)} of this "
        f"machine's {format_value(ram, 'bytes')} RAM."
    ]
    if fraction < 0.5:
        larger = ""
        if profile_bytes:
            over = {name: size for name, size in profile_bytes.items() if size > ram}
            if over:
                larger = " The " + ", ".join(
                    f"opt-in `{name}` profile ({format_value(size, 'bytes')}, "
                    f"{format_percent(size / ram)} of RAM)" for name, size in over.items()
                ) + " measures it."
        sentences.append(
            "So these results do not show what happens as a dataset approaches or passes RAM: "
            "every warm case here fits in the page cache." + larger)
    return sentences


ACCESS_ORDER = ("sequential", "block_shuffle", "shuffle")
ACCESS_NAMES = {"sequential": "sequential", "block_shuffle": "block-shuffled",
                "shuffle": "shuffled"}


def access_order_table(df: pd.DataFrame, *, loader: str = "lazy") -> pd.DataFrame:
    """Per raw-array dataset and cache state: one-thread epoch throughput of ``loader`` in
    each access order of the lazy_vs_preloaded study (medians), and each order against
    sequential."""
    table = loader_table(df)
    table = table[(table["encoding"] == "raw") & (table["loader"] == loader)]
    columns = ["format", "cache", *ACCESS_ORDER, "block_shuffle_vs_sequential",
               "shuffle_vs_sequential", "resident_fraction"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    wide = table.pivot_table(index=["format", "cache"], columns="access",
                             values="samples_per_s")
    resident = table.groupby(["format", "cache"])["resident_fraction"].median()
    out = pd.DataFrame({order: wide.get(order) for order in ACCESS_ORDER})
    out["resident_fraction"] = resident
    out = out.reset_index()
    for order in ("block_shuffle", "shuffle"):
        out[f"{order}_vs_sequential"] = out[order] / out["sequential"]
    out = out.sort_values("cache", key=lambda c: c.map({"cold": 0, "warm": 1}),
                          kind="stable")
    return _sort(out)[columns]


def access_order_findings(df: pd.DataFrame) -> list[str]:
    """Per cache state: which format loses most and least by shuffling (lazy, raw arrays)
    and what block shuffle wins back."""
    table = access_order_table(df).dropna(subset=["sequential", "shuffle"])
    sentences = []
    for cache, part in table.groupby("cache", sort=False):
        loss = part.set_index("format")["shuffle_vs_sequential"]
        worst, best = loss.idxmin(), loss.idxmax()
        text = (f"Raw arrays, {cache}, read lazily by one thread: a full shuffle runs at "
                f"{format_ratio(loss[worst])} of sequential throughput on {worst} "
                f"(the worst) and {format_ratio(loss[best])} on {best}")
        block = part.set_index("format")["block_shuffle_vs_sequential"].dropna()
        if worst in block:
            text += (f"; block shuffle brings {worst} to {format_ratio(block[worst])} of "
                     "sequential")
        sentences.append(text + ".")
    return sentences


READAHEAD_OPTIONS = {"memmap": "madvise_random", "lmdb": "readahead"}


def readahead_table(df: pd.DataFrame) -> pd.DataFrame:
    """The readahead knobs of the memory-mapped formats (lazy, cold, shuffled epoch): per
    setting, throughput (median, spread) and time to first batch."""
    rows = select(df[df["study"] == "lazy_vs_preloaded"])
    rows = rows[rows["params"].map(lambda text: bool(open_options(text)))]
    columns = ["format", "option", "setting", "samples_per_s", "low", "high", "repeats",
               "time_to_first_batch_s", "resident_fraction"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    options = rows["params"].map(open_options)
    rows = rows.assign(option=options.map(lambda o: next(iter(o))),
                       setting=options.map(lambda o: str(next(iter(o.values())))))
    keys = ["format", "option", "setting"]
    table = summary_table(rows, "samples_per_s", keys).rename(
        columns={"median": "samples_per_s"})
    first = summary_table(rows, "time_to_first_batch_s", keys).set_index(keys)["median"]
    table = table.set_index(keys)
    table["time_to_first_batch_s"] = first
    return _sort(table.reset_index())[columns]


def readahead_findings(df: pd.DataFrame) -> list[str]:
    """Each readahead knob on against off, cold and shuffled, from the same study."""
    table = readahead_table(df)
    sentences = []
    for (fmt, option), part in table.groupby(["format", "option"], sort=False):
        by = part.set_index("setting")["samples_per_s"]
        if {"True", "False"} <= set(by.index):
            sentences.append(
                f"{fmt}, cold, shuffled: {option}=True runs "
                f"{relative_text(by['True'] / by['False'])} {option}=False "
                f"({format_value(by['True'], 'samples/s')} vs "
                f"{format_value(by['False'], 'samples/s')}).")
    return sentences


# -- 03: prefetchers ---------------------------------------------------------------------------
PREFETCHER_NAMES = {
    "none": "this thread",
    "thread": "ThreadPrefetcher",
    "process": "ProcessPrefetcher",
    "pickled_baseline": "pickled-queue baseline",
    "locked_list_baseline": "locked-list baseline",
    "torch": "torch DataLoader",
    "tf_data": "tf.data TFRecord AUTOTUNE",
    "tf_generator": "tf.data from_generator (GIL-bound)",
}


def _variant(row: pd.Series) -> str:
    name = PREFETCHER_NAMES.get(row["prefetcher"], row["prefetcher"])
    workers = row["workers"]
    label = name if pd.isna(workers) or workers == 0 else f"{name} x{int(workers)}"
    method = row.get("param_start_method")
    if isinstance(method, str) and method != "fork":
        label += f" ({method})"
    return label


def prefetch_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, decoder and prefetch variant: throughput (median, spread), its speedup
    over the single-threaded loop on the same dataset and decoder, CPU utilisation and peak
    PSS."""
    rows = with_params(select(df[df["study"] == "prefetch"]))
    columns = ["dataset", "decode", "variant", "prefetcher", "workers", "samples_per_s", "low",
               "high", "repeats", "speedup", "cpu_utilisation", "peak_pss_bytes"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    rows["dataset"] = rows["format"] + "-" + rows["encoding"]
    rows["decode"] = (rows["param_decode"].fillna("none") if "param_decode" in rows
                      else "none")
    rows["variant"] = rows.apply(_variant, axis=1)
    keys = ["dataset", "decode", "variant", "prefetcher", "workers"]
    rows["workers"] = rows["workers"].fillna(0).astype(int)
    throughput = summary_table(rows, "samples_per_s", keys).set_index(keys)
    table = throughput.rename(columns={"median": "samples_per_s"})
    for metric in ("cpu_utilisation", "peak_pss_bytes"):
        table[metric] = summary_table(rows, metric, keys).set_index(keys)["median"]
    table = table.reset_index()
    serial = table[table["prefetcher"] == "none"].set_index(["dataset", "decode"])[
        "samples_per_s"]
    table["speedup"] = [row["samples_per_s"] / serial.get((row["dataset"], row["decode"]),
                                                          np.nan)
                        for _, row in table.iterrows()]
    return table[columns]


def prefetch_findings(df: pd.DataFrame) -> list[str]:
    """Sentences per dataset of the prefetch study: best path and its speedup, ours against
    torch DataLoader and the pickled-queue baseline, threads against processes, fork against
    spawn, and GIL-holding against GIL-releasing decoders where both were measured."""
    table = prefetch_table(df)
    sentences = []
    for (dataset, decode), part in table.groupby(["dataset", "decode"], sort=False):
        label = dataset + ("" if decode == "none" else f", decoded with {decode}")
        serial = part[part["prefetcher"] == "none"]
        best = _best(part, "samples_per_s")
        kind = "copy-bound" if decode == "none" else "decode-bound"
        if not serial.empty:
            alone = format_value(serial["samples_per_s"].iloc[0], "samples/s")
            if best["prefetcher"] == "none":
                others = part[part["prefetcher"] != "none"]
                runner_up = _best(others, "samples_per_s") if not others.empty else None
                closest = "" if runner_up is None else (
                    f"; the closest is {runner_up['variant']} at "
                    f"{format_value(runner_up['samples_per_s'], 'samples/s')} "
                    f"({format_ratio(runner_up['speedup'])} one thread)")
                sentences.append(f"{label} ({kind}): no prefetcher beats one thread "
                                 f"({alone}, median of {best['repeats']} repeats){closest}.")
            else:
                sentences.append(
                    f"{label} ({kind}): one thread delivers {alone}; the fastest path is "
                    f"{best['variant']} at {format_value(best['samples_per_s'], 'samples/s')} "
                    f"({format_ratio(best['speedup'])} one thread, median of {best['repeats']} "
                    f"repeats, {format_value(best['low'], 'samples/s')}{DASH}"
                    f"{format_value(best['high'], 'samples/s')}).")
        by_variant = part.set_index("variant")["samples_per_s"]
        pairs = (("ProcessPrefetcher x2", "torch DataLoader x2"),
                 ("ProcessPrefetcher x2", "pickled-queue baseline x2"),
                 ("ThreadPrefetcher x1", "locked-list baseline x1"),
                 ("ThreadPrefetcher x2", "ProcessPrefetcher x2"),
                 ("ThreadPrefetcher x2", "ThreadPrefetcher x1"),
                 ("ThreadPrefetcher x2", "tf.data from_generator (GIL-bound)"),
                 ("ProcessPrefetcher x2 (spawn)", "ProcessPrefetcher x2"))
        for ours, theirs in pairs:
            if ours in by_variant and theirs in by_variant:
                sentences.append(
                    f"{label}: {ours} is {relative_text(by_variant[ours] / by_variant[theirs])}"
                    f" {theirs} ({format_value(by_variant[ours], 'samples/s')}"
                    f" vs {format_value(by_variant[theirs], 'samples/s')})."
                )
    sentences += worker_sweep_findings(table)
    decoders = table[table["decode"].isin(["pil", "simplejpeg"])]
    for dataset, part in decoders.groupby("dataset", sort=False):
        threads = part[part["variant"] == "ThreadPrefetcher x2"].set_index("decode")["speedup"]
        if {"pil", "simplejpeg"} <= set(threads.index):
            sentences.append(
                f"{dataset}: two threads speed up GIL-releasing simplejpeg decoding "
                f"{format_ratio(threads['simplejpeg'])} over one thread, GIL-holding PIL "
                f"decoding {format_ratio(threads['pil'])}."
            )
    return sentences


def worker_sweep_findings(table: pd.DataFrame) -> list[str]:
    """From ``prefetch_table``: for thread and process prefetchers swept over worker counts,
    where throughput peaks and what the largest count (oversubscribing the cores, on a
    small machine) does against the peak."""
    sentences = []
    swept = table[table["prefetcher"].isin(["thread", "process"])
                  & ~table["variant"].str.contains("(", regex=False)]
    for (dataset, decode, prefetcher), part in swept.groupby(
            ["dataset", "decode", "prefetcher"], sort=False):
        if part["workers"].nunique() < 3:
            continue
        peak = _best(part, "samples_per_s")
        most = part.loc[part["workers"].idxmax()]
        label = dataset + ("" if decode == "none" else f", {decode}")
        sentences.append(
            f"{label}: {PREFETCHER_NAMES[prefetcher]} peaks at {int(peak['workers'])} "
            f"worker(s) ({format_value(peak['samples_per_s'], 'samples/s')}); "
            f"{int(most['workers'])} workers reach "
            f"{format_ratio(most['samples_per_s'] / peak['samples_per_s'])} of that peak.")
    return sentences


def decoder_table(df: pd.DataFrame) -> pd.DataFrame:
    """The JPEG set's serial, thread and process throughput with each decoder (2 workers),
    and each prefetcher's speedup over serial decoding with the same decoder."""
    table = prefetch_table(df)
    table = table[table["decode"].isin(["pil", "simplejpeg"])]
    chosen = {"this thread": "serial", "ThreadPrefetcher x2": "thread x2",
              "ProcessPrefetcher x2": "process x2"}
    table = table[table["variant"].isin(chosen)]
    columns = ["dataset", "decode", "path", "samples_per_s", "low", "high", "speedup"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    return table.assign(path=table["variant"].map(chosen))[columns].reset_index(drop=True)


def decoder_findings(df: pd.DataFrame) -> list[str]:
    """Which decoders the prefetch study ran, how threads scaled each, and the thread-decode
    target (threads over a GIL-releasing decoder vs serial decode, same case)."""
    table = prefetch_table(df)
    decoders = sorted(set(table["decode"]) - {"none", "tf"})
    sentences = []
    if decoders:
        missing = sorted({"pil", "simplejpeg"} - set(decoders))
        sentences.append(
            "The prefetch study decoded with " + " and ".join(decoders)
            + (f"; {', '.join(missing)} was not measured there, so this run cannot compare "
               "GIL-holding and GIL-releasing decoders under the same prefetchers"
               if missing else "") + ".")
        for decode in decoders:
            part = table[table["decode"] == decode].set_index("variant")["speedup"]
            threads = [v for v in ("ThreadPrefetcher x1", "ThreadPrefetcher x2",
                                   "ProcessPrefetcher x2") if v in part]
            if threads:
                sentences.append(f"With {decode}: " + ", ".join(
                    f"{v} runs at {format_ratio(part[v])} one thread" for v in threads) + ".")
    targets = targets_table(df).set_index("target")
    name = "ThreadPrefetcher vs serial decode"
    if name in targets.index:
        row = targets.loc[name]
        sentences.append(
            f"Decoding JPEG with the GIL-releasing decoder on 2 threads runs "
            f"{format_ratio(row['value'])} serial decode (median of {row['repeats']} paired "
            f"repeats, {format_ratio(row['low'])}{DASH}{format_ratio(row['high'])}; "
            f"target {format_ratio(row['threshold'])}).")
    return sentences


# -- targets (the loaders issue's performance figures) --------------------------------------
def targets_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per target measured, from the rows its case wrote: the whole-case
    ``target_value`` (median of the per-repeat ratios), ``target_threshold`` and
    ``target_met``; min and max of the per-repeat ``target_ratio``; by how much it is
    missed. Targets are listed in ``bench.targets.TARGETS`` order."""
    from storebench.bench.targets import TARGETS

    columns = ["target", "value", "low", "high", "threshold", "met", "shortfall", "repeats",
               "what"]
    rows = latest_runs(df[df["study"] == "targets"])
    rows = rows[rows["status"] == "ok"]
    out = []
    for target in TARGETS:
        mine = rows[rows["loader"] == target.key]
        whole = mine[mine["repeat"] == -1].set_index("metric")["value"]
        if "target_value" not in whole:
            continue
        ratios = mine.loc[(mine["repeat"] >= 0) & (mine["metric"] == "target_ratio"), "value"]
        value, threshold = float(whole["target_value"]), float(whole["target_threshold"])
        out.append({
            "target": target.name, "value": value,
            "low": float(ratios.min()) if len(ratios) else value,
            "high": float(ratios.max()) if len(ratios) else value,
            "threshold": threshold, "met": bool(whole["target_met"] >= 1),
            "shortfall": max(0.0, 1 - value / threshold), "repeats": int(ratios.size),
            "what": target.description,
        })
    return pd.DataFrame(out, columns=columns)


def targets_markdown(df: pd.DataFrame) -> str:
    from storebench.bench.targets import TARGETS

    table = targets_table(df)
    if table.empty:
        return "No target was measured."
    fractions = {t.name for t in TARGETS if t.denominator is None}
    text = [format_percent if name in fractions else format_ratio for name in table["target"]]
    shown = pd.DataFrame({
        "target": table["target"],
        "measured (median, min–max)": [
            f"{fmt(v)} ({fmt(lo)}{DASH}{fmt(hi)}, n={n})"
            for fmt, v, lo, hi, n in zip(text, table["value"], table["low"], table["high"],
                                         table["repeats"])],
        "threshold": [f"\u2265 {fmt(t)}" for fmt, t in zip(text, table["threshold"])],
        "met": ["yes" if met else f"no ({format_percent(short)} short)"
                for met, short in zip(table["met"], table["shortfall"])],
    })
    return markdown_table(shown)


def tf_data_findings(df: pd.DataFrame) -> list[str]:
    """tf.data against our loaders over the same TFRecord shards (the tfrecord target)."""
    rows = select(df[(df["study"] == "targets") & (df["loader"] == "torch_vs_tf_data")])
    names = {"tf_data_autotune": "tf.data AUTOTUNE",
             "torch_process_prefetcher": "our ProcessPrefetcher (torch tensors)",
             "torch_dataloader": "torch DataLoader"}
    stats = {}
    for path, name in names.items():
        try:
            stats[name] = stat(rows, f"{path}.samples_per_s")
        except MissingResultError:
            continue
    sentences = []
    if len(stats) >= 2:
        parts = [f"{name} {value} ({value.spread})" for name, value in stats.items()]
        dataset = rows["format"].iloc[0] + "-" + rows["encoding"].iloc[0]
        sentences.append(f"Over the {dataset} shards, with 2 workers "
                         f"({repeats_text(*stats.values())}): " + "; ".join(parts) + ".")
    table = prefetch_table(df)
    native = table[table["prefetcher"] == "tf_data"]
    ours = table[(table["decode"] == "simplejpeg")
                 & table["prefetcher"].isin(["thread", "process"])]
    if not native.empty and not ours.empty:
        tf_row, best = native.iloc[0], _best(ours, "samples_per_s")
        sentences.append(
            f"The same JPEG samples: {tf_row['variant']} over {tf_row['dataset']} (TensorFlow "
            f"decodes) delivers {format_value(tf_row['samples_per_s'], 'samples/s')}; our "
            f"best, {best['variant']} over {best['dataset']} with simplejpeg, "
            f"{format_value(best['samples_per_s'], 'samples/s')} "
            f"({format_ratio(best['samples_per_s'] / tf_row['samples_per_s'])} tf.data).")
    generator = table[table["prefetcher"] == "tf_generator"]
    for _, row in generator.iterrows():
        sentences.append(
            f"{row['variant']} over {row['dataset']}"
            + ("" if row["decode"] == "none" else f" ({row['decode']})")
            + f": {format_value(row['samples_per_s'], 'samples/s')}, "
            f"{format_ratio(row['speedup'])} one thread without TensorFlow.")
    return sentences


# -- 04: feeding the accelerator --------------------------------------------------------------
def _copy_mode(params: Mapping) -> str:
    if params.get("non_blocking"):
        return "pinned, non_blocking"
    if params.get("pinned"):
        return "pinned, sync"
    return "pageable, sync"


def feed_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per emulated compute time, loader and copy mode: accelerator utilisation, stall
    fraction, host-to-device GB/s and samples/s (medians)."""
    rows = select(df[df["study"] == "gpu_feed"])
    columns = ["compute_ms", "loader", "copy", "accelerator_utilisation", "stall_fraction",
               "h2d_GBps", "samples_per_s", "repeats"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    params = rows["params"].map(json.loads)
    rows = rows.assign(
        compute_ms=params.map(lambda p: float(p.get("compute_ms", 0.0))),
        copy=params.map(_copy_mode),
        loader=rows.apply(_variant, axis=1),
    )
    keys = ["compute_ms", "loader", "copy"]
    table = None
    for metric in ("accelerator_utilisation", "stall_fraction", "h2d_GBps", "samples_per_s"):
        part = summary_table(rows, metric, keys).set_index(keys)
        if table is None:
            table = part[["median", "repeats"]].rename(columns={"median": metric})
        else:
            table[metric] = part["median"]
    return table.reset_index().sort_values(keys, kind="stable").reset_index(drop=True)[columns]


def feed_devices(df: pd.DataFrame) -> pd.DataFrame:
    """Where the gpu_feed cases copied to, from their rows' params: one row per
    (device, device_name, emulated). Cases from before these params existed count as
    emulated copies to the CPU."""
    rows = latest_runs(df[df["study"] == "gpu_feed"])
    columns = ["device", "device_name", "emulated"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    params = rows["params"].map(json.loads)
    found = pd.DataFrame({
        "device": params.map(lambda p: p.get("device", "cpu")),
        "device_name": params.map(lambda p: p.get("device_name", p.get("device", "cpu"))),
        "emulated": params.map(lambda p: bool(p.get("emulated", True))),
    })
    return found.drop_duplicates().reset_index(drop=True)


def feed_device_text(df: pd.DataFrame) -> str:
    """What the feed numbers are, from the gpu_feed rows themselves: real CUDA copies, or
    host copies into an emulated device."""
    devices = feed_devices(df)
    if devices.empty:
        return "No accelerator-feed results."
    real = devices[~devices["emulated"]]
    if not real.empty:
        names = ", ".join(sorted(set(real["device_name"])))
        return (f"Copies went to {names} (a real CUDA device, timed with CUDA events); the "
                "model's compute is emulated (a fixed time per batch, as MLPerf Storage does).")
    return ("No CUDA device took part (every feed row says emulated): the accelerator is "
            "emulated (a fixed compute time per batch, as MLPerf Storage does) and the "
            "host-to-device copy is a memcpy into a preallocated CPU tensor, so pinned and "
            "non_blocking copies were not measured.")


def feed_findings(df: pd.DataFrame) -> list[str]:
    """Sentences: AU per loader at each compute time, the smallest compute time reaching
    ``AU_THRESHOLD``, and pinned/non_blocking against pageable copies when measured."""
    table = feed_table(df)
    if table.empty:
        return []
    sentences = [feed_device_text(df)]
    busy = table[table["compute_ms"] > 0]
    for compute_ms, part in busy.groupby("compute_ms"):
        described = "; ".join(
            f"{row['loader']} ({row['copy']}) {format_percent(row['accelerator_utilisation'])}"
            for _, row in part.iterrows())
        sentences.append(f"At {_num(compute_ms)} ms of compute per batch, accelerator "
                         f"utilisation is: {described}.")
    for (loader, copy), part in busy.groupby(["loader", "copy"], sort=False):
        reached = part[part["accelerator_utilisation"] >= AU_THRESHOLD]
        if reached.empty:
            sentences.append(
                f"{loader} ({copy}) stays below {format_percent(AU_THRESHOLD)} AU up to "
                f"{_num(part['compute_ms'].max())} ms per batch (at best "
                f"{format_percent(part['accelerator_utilisation'].max())}).")
        else:
            sentences.append(
                f"{loader} ({copy}) keeps AU at or above {format_percent(AU_THRESHOLD)} from "
                f"{_num(reached['compute_ms'].min())} ms of compute per batch.")
    zero = table[table["compute_ms"] == 0]
    if not zero.empty:
        fastest = _best(zero, "samples_per_s")
        sentences.append(
            f"With no compute the feed itself runs at "
            f"{format_value(fastest['samples_per_s'], 'samples/s')} ({fastest['loader']}, "
            f"{fastest['copy']}, {format_value(fastest['h2d_GBps'], 'GB/s')} copied).")
    copies = table.pivot_table(index=["compute_ms", "loader"], columns="copy",
                               values="h2d_GBps")
    if "pinned, sync" in copies and "pageable, sync" in copies:
        gain = (copies["pinned, sync"] / copies["pageable, sync"]).median()
        sentences.append(f"Pinned host buffers copy at {format_ratio(gain)} the rate of pageable "
                         "ones (median over loaders and compute times).")
    au = table.pivot_table(index=["compute_ms", "loader"], columns="copy",
                           values="accelerator_utilisation")
    if "pinned, non_blocking" in au and "pinned, sync" in au:
        delta = (au["pinned, non_blocking"] - au["pinned, sync"]).median()
        sentences.append(f"Asynchronous (non_blocking) copies change AU by {100 * delta:+.0f} "
                         "percentage points against synchronous pinned copies (median).")
    return sentences


# -- 05: the decision guide -------------------------------------------------------------------
def _guide_row(situation: str, choice: str, evidence: str) -> dict:
    return {"situation": situation, "choice": choice, "evidence": evidence}


def decision_guide(df: pd.DataFrame, env: Mapping | None = None) -> pd.DataFrame:
    """Which format and loader for which situation, each with the numbers behind it; a
    situation whose results are missing is left out."""
    rows = []
    lvp = loader_table(df)
    lvp = lvp[lvp["access"] == "block_shuffle"]  # the order every dataset was read in
    raw_warm = lvp[(lvp["encoding"] == "raw") & (lvp["cache"] == "warm")]
    lazy_warm = raw_warm[raw_warm["loader"] == "lazy"]
    preloaded_warm = raw_warm[raw_warm["loader"] == "preloaded"]
    if not lazy_warm.empty and not preloaded_warm.empty:
        lazy_best = _best(lazy_warm, "samples_per_s")
        pre_best = _best(preloaded_warm, "samples_per_s")
        quickest = _best(preloaded_warm, "preload_seconds", lowest=True)
        ratio = pre_best["samples_per_s"] / lazy_best["samples_per_s"]
        if ratio >= 1:
            choice = (f"preload (PreloadedDataset); fastest preload from {quickest['format']}")
        else:
            choice = f"{lazy_best['format']}, lazy"
        rows.append(_guide_row(
            "Raw arrays that fit in RAM, read in one process", choice,
            f"preloaded {format_value(pre_best['samples_per_s'], 'samples/s')} vs the best lazy "
            f"reader ({lazy_best['format']}) "
            f"{format_value(lazy_best['samples_per_s'], 'samples/s')}, warm, block-shuffled; "
            f"preloading took "
            f"{format_value(quickest['preload_seconds'], 's')} from {quickest['format']}"))
    raw_cold = lvp[(lvp["encoding"] == "raw") & (lvp["cache"] == "cold")
                   & (lvp["loader"] == "lazy")]
    if not raw_cold.empty:
        best = _best(raw_cold, "samples_per_s")
        worst = _best(raw_cold, "samples_per_s", lowest=True)
        rows.append(_guide_row(
            "Raw arrays streamed from storage (first epoch, or larger than RAM)",
            f"{best['format']}, lazy, block-shuffled",
            f"{format_value(best['samples_per_s'], 'samples/s')} from a cold cache "
            f"({format_percent(best['resident_fraction'])} resident at start); "
            f"{format_ratio(best['samples_per_s'] / worst['samples_per_s'])} the slowest "
            f"({worst['format']})"))
    prefetch = prefetch_table(df)
    decoded = prefetch[prefetch["decode"] != "none"]
    if not decoded.empty:
        best = _best(decoded, "samples_per_s")
        rows.append(_guide_row(
            f"Compressed images (decode-bound, {best['dataset']})",
            f"{best['variant']} with {best['decode']}",
            f"{format_value(best['samples_per_s'], 'samples/s')}, "
            f"{format_ratio(best['speedup'])} one thread"))
    with_variants = build_cost_table(df)
    build = build_cost_table(default_builds(df))
    if not build.empty:
        raw = build[build["encoding"] == "raw"] if "raw" in set(build["encoding"]) else build
        for situation, encodings in (("Least disk space, lossless", ("raw", "png")),
                                     ("Least disk space, lossy JPEG accepted", ("jpeg",))):
            # Knob variants count here: a codec is how a format gets smaller.
            candidates = with_variants[with_variants["encoding"].isin(encodings)]
            if candidates.empty:
                continue
            smallest = _best(candidates, "size_ratio", lowest=True)
            rows.append(_guide_row(
                situation, f"{ENCODING_NAMES[smallest['encoding']]} in {smallest['dataset']}",
                f"{_sig(smallest['size_ratio'])}{MULTIPLY} the raw pixel bytes "
                f"({format_value(smallest['bytes_apparent'], 'bytes')})"))
        fast = _best(raw, "write_seconds", lowest=True)
        slow = _best(raw, "write_seconds")
        rows.append(_guide_row(
            "Fastest to build (raw arrays)",
            fast["format"],
            f"{format_value(fast['write_seconds'], 's')} vs "
            f"{format_value(slow['write_seconds'], 's')} for {slow['format']}"))
        few = _best(raw, "file_count", lowest=True)
        many = _best(raw, "file_count")
        rows.append(_guide_row(
            "Few files (shared or object storage, many-file limits)",
            f"anything but {many['format']}",
            f"{many['format']} writes {format_value(many['file_count'], 'count')} files; "
            f"{few['format']} {format_value(few['file_count'], 'count')}"))
    targets = targets_table(df).set_index("target")
    name = "ProcessPrefetcher vs torch DataLoader"
    if name in targets.index:
        ratio = targets.loc[name, "value"]
        rows.append(_guide_row(
            "Training with PyTorch (decoded arrays, 2 workers)",
            "storebench ProcessPrefetcher" if ratio >= 1 else "torch DataLoader",
            f"ProcessPrefetcher at {format_ratio(ratio)} torch DataLoader's throughput"))
    name = "our best PyTorch path vs tf.data over TFRecord"
    if name in targets.index:
        ratio = targets.loc[name, "value"]
        rows.append(_guide_row(
            "TFRecord shards",
            "tf.data AUTOTUNE in TensorFlow; " + (
                "our PyTorch path keeps up with it" if ratio >= 1 else
                "PyTorch paths fall behind it"),
            f"best PyTorch path (ProcessPrefetcher or DataLoader) at {format_ratio(ratio)} "
            "tf.data's throughput on the same shards"))
    name = "block-shuffled vs random Parquet rows"
    if name in targets.index:
        rows.append(_guide_row(
            "Shuffling a Parquet (or any chunked) set",
            "block shuffle: shuffle row groups, then within them",
            f"{format_ratio(targets.loc[name, 'value'])} faster than random row access"))
    feed = feed_table(df)
    busy = feed[feed["compute_ms"] > 0]
    if not busy.empty:
        top = busy[busy["compute_ms"] == busy["compute_ms"].min()]
        best = _best(top, "accelerator_utilisation")
        real = feed_devices(df)["emulated"].eq(False).any()
        emulated = "" if real else " (emulated accelerator)"
        rows.append(_guide_row(
            "Keeping an accelerator busy with short steps",
            f"{best['loader']}, {best['copy']}",
            f"AU {format_percent(best['accelerator_utilisation'])} at "
            f"{_num(best['compute_ms'])} ms per batch{emulated}"))
    return pd.DataFrame(rows, columns=["situation", "choice", "evidence"])


def caveats(df: pd.DataFrame, env: Mapping | None = None) -> list[str]:
    """What the results cover and what they do not, from the results themselves."""
    rows = latest_runs(df)
    cases = rows.drop_duplicates(["study", "case_id"])
    failures = failed_cases(df)
    timed = rows[(rows["repeat"] >= 0).fillna(False) & (rows["status"] == "ok")]
    per_case = timed.groupby(["study", "case_id"])["repeat"].nunique()
    if per_case.empty:
        repeats = "no timed repeats"
    elif per_case.min() == per_case.max():
        repeats = f"{per_case.min()} timed repeat(s) per case"
    else:
        repeats = f"{per_case.min()}{DASH}{per_case.max()} timed repeats per case"
    profiles = ", ".join(f"`{p}`" for p in sorted(set(rows["profile"])) if p)
    sentences = [
        f"{len(cases)} cases in {rows['study'].nunique()} studies, profile {profiles}, "
        f"from {rows['run_id'].nunique()} run(s); {repeats} (figures are medians, ranges min "
        "to max)."
    ]
    if failures.empty:
        sentences.append("No case failed.")
    else:
        listed = "; ".join(f"{r.case_id} ({r.status}: {r.error})"
                           for r in failures.head(5).itertuples())
        sentences.append(f"{len(failures)} case(s) failed or timed out: {listed}.")
    if env:
        if not feed_devices(df).empty:
            sentences.append(feed_device_text(df))
        sentences += ram_findings(df, env)
        limits = env.get("limits") or {}
        if limits:
            def limit(key: str, unit: str) -> str:
                return format_value(limits.get(key, math.nan), unit)

            sentences.append(
                f"Machine limits measured in the same run: DRAM read "
                f"{limit('dram_read_GBps', 'GB/s')}, page-cache read "
                f"{limit('page_cache_read_GBps', 'GB/s')}, cold sequential read "
                f"{limit('cold_seq_read_GBps', 'GB/s')}, cold 4 KiB random reads "
                f"{limit('cold_random_4k_iops', 'IOPS')}.")
    return sentences


def machine_text(env: Mapping) -> str:
    """One line on where results came from, from env.json."""
    cores = env.get("cpus_usable") or env.get("cpu_count")
    storage = env.get("storage", {})
    disk = " ".join(str(storage[k]) for k in ("fs_type", "device") if storage.get(k))
    cuda = env.get("cuda", {})
    gpu = ", ".join(cuda.get("devices") or []) if cuda.get("torch_cuda_available") else "no GPU"
    parts = [
        f"{env.get('cpu_model', 'unknown CPU')}, {cores} cores",
        f"{format_value(env['ram_bytes'], 'bytes')} RAM" if env.get("ram_bytes") else "",
        f"{disk}" if disk else "",
        gpu,
        f"profile `{env['profile']}`" if env.get("profile") else "",
        f"run {env['utc_time']}" if env.get("utc_time") else "",
    ]
    return "; ".join(p for p in parts if p)


def readme_findings_table(results_dir: Path | str) -> str:
    """The README's findings table (markdown) from ``<results_dir>/*.csv`` and env.json:
    a line on the machine, then situation | choice | evidence."""
    from storebench.bench.schema import read_all_results

    results_dir = Path(results_dir)
    df = read_all_results(results_dir)
    if df.empty:
        raise FileNotFoundError(f"{results_dir}: no results (*.csv)")
    env_path = results_dir / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    guide = decision_guide(df, env)
    header = f"Measured on: {machine_text(env)}." if env else "Machine unknown (no env.json)."
    return header + "\n\n" + markdown_table(guide) + "\n"


# -- display -------------------------------------------------------------------------------
PERCENT_COLUMNS = ("resident_fraction", "cold_resident", "warm_resident",
                   "accelerator_utilisation", "stall_fraction", "shortfall")
RATIO_COLUMNS = ("warm_over_cold", "speedup")
# Shown to three significant figures (size_ratio: 1.04× is not 1.0×), or as typed (grid values).
PRECISE_RATIO_COLUMNS = ("size_ratio",)
GRID_COLUMNS = ("compute_ms",)


def format_table(table: pd.DataFrame, units: Mapping[str, str] | None = None) -> pd.DataFrame:
    """``table`` with numbers as text: a column named after a metric gets the metric's unit
    (``schema.METRIC_UNITS``), fractions become percentages, ratios ``×``; ``units`` names
    the unit of other columns (e.g. ``{"median": "samples/s"}``)."""
    from storebench.bench.schema import METRIC_UNITS

    units = dict(units or {})
    out = table.copy()
    for column in table.columns:
        values = table[column]
        if column in PERCENT_COLUMNS:
            out[column] = values.map(format_percent)
        elif column in RATIO_COLUMNS:
            out[column] = values.map(format_ratio)
        elif column in PRECISE_RATIO_COLUMNS:
            out[column] = values.map(lambda v: f"{_sig(v)}{MULTIPLY}" if _finite(v) else "")
        elif column in GRID_COLUMNS:
            out[column] = values.map(_num)
        elif column in units or (column in METRIC_UNITS and METRIC_UNITS[column] != "ratio"):
            unit = units.get(column, METRIC_UNITS.get(column))
            out[column] = values.map(lambda v, unit=unit: format_value(v, unit))
        elif pd.api.types.is_float_dtype(values):
            out[column] = values.map(lambda v: _sig(v) if _finite(v) else "")
    return out
