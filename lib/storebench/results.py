"""The one results-query layer: plots, findings and the decision guide all select rows,
medians, spreads and ratios here, so a figure and the sentence under it come from the same
rows.

Conventions:

- a case's figure is the **median over its ok timed repeats** (``repeat >= 0``); the spread
  is min to max and ``count`` the number of repeats;
- when a results file holds several runs of the same case (a resumed or repeated study), the
  latest run of each case is used, so one case never mixes runs;
- two paths are compared as a **repeat-paired ratio**: repeat ``i`` of one with repeat ``i``
  of the other, bootstrapped (``ratio_interval``); ``TIE_RULE`` says when that is a tie.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .bench.case import open_options
from .bench.stats import MIN_DECISION_REPEATS
from .text import DASH, ENCODING_ORDER, format_value

# Bootstrap of the ratio of medians: resamples and the interval's level.
BOOTSTRAP_RESAMPLES = 4000
INTERVAL_LEVEL = 0.95
# A winner is named only when it is better by more than this practical margin...
DECISION_MARGIN = 0.05
# ... with at least this many repeats on each side; fewer, and the comparison is undecided.
MIN_PAIRED_REPEATS = MIN_DECISION_REPEATS
TIE_RULE = (
    "The guide names the candidate with the best median only when the 95% bootstrap "
    "interval of the ratio of its median to the runner-up's excludes 1.0 and the ratio is "
    f"beyond the {DECISION_MARGIN:.0%} margin, with at least {MIN_PAIRED_REPEATS} repeats on "
    f"each side. It says \"equivalent within {DECISION_MARGIN:.0%}\" when the whole interval "
    f"lies within the margin (between 1/{1 + DECISION_MARGIN:g} and {1 + DECISION_MARGIN:g}), "
    "and \"undecided\" otherwise, with the repeats on each side. Repeats are resampled in "
    "pairs (repeat i of one path with repeat i of the other) when both took the same number, "
    f"each path's on its own otherwise ({BOOTSTRAP_RESAMPLES} resamples, seed 0). Sizes and "
    f"file counts are exact: beyond the margin a winner, within it equivalent."
)


class MissingResultError(LookupError):
    """The results hold no ok row for what a finding needs."""


WORKLOADS_FILE = "workloads.json"


@dataclass(frozen=True)
class Results:
    """A results directory's rows (every ``*.csv``) and its ``env.json``."""

    df: pd.DataFrame
    env: Mapping = field(default_factory=dict)
    directory: Path | None = None
    # Study -> encoding -> what its cases read and did (``WORKLOADS_FILE``, written as
    # each study runs): every guide row names the workload it measured.
    workloads: Mapping = field(default_factory=dict)

    @classmethod
    def load(cls, results_dir: Path | str) -> Results:
        """Raises ``FileNotFoundError`` naming the directory when it is missing or holds
        no results."""
        from .bench.schema import read_all_results

        results_dir = Path(results_dir)
        df = read_all_results(results_dir)
        if df.empty:
            raise FileNotFoundError(f"{results_dir}: no results (*.csv, *.csv.gz)")
        env_path = results_dir / "env.json"
        env = json.loads(env_path.read_text()) if env_path.exists() else {}
        workloads_path = results_dir / WORKLOADS_FILE
        workloads = json.loads(workloads_path.read_text()) if workloads_path.exists() else {}
        return cls(df, env, results_dir, workloads)

    def workload(self, study: str, encoding: str | None = None) -> str:
        """What ``study``'s cases of ``encoding`` read (all its encodings' workloads, joined,
        without one); "" where the results do not say."""
        of_study = self.workloads.get(study) or {}
        if encoding is not None and encoding in of_study:
            return str(of_study[encoding])
        return "; ".join(str(text) for text in of_study.values())

    def study(self, name: str) -> pd.DataFrame:
        """The rows of one study."""
        return self.df[self.df["study"] == name]

    @property
    def limits(self) -> dict:
        return dict(self.env.get("limits") or {})

    def study_env(self, name: str) -> Mapping:
        """The environment of the run that wrote ``name``'s latest rows: ``env.json``, or
        ``env-<run id>.json`` beside it for a study run on its own (empty if neither)."""
        rows = latest_runs(self.study(name))
        if rows.empty or self.directory is None:
            return self.env
        run_id = str(rows["run_id"].iloc[-1])
        if self.env.get("run_id") == run_id:
            return self.env
        path = self.directory / f"env-{run_id}.json"
        if path.exists():
            return json.loads(path.read_text())
        # A file named for the first of several runs made together holds the last run's id.
        for other in sorted(self.directory.glob("env-*.json")):
            env = json.loads(other.read_text())
            if env.get("run_id") == run_id:
                return env
        return {}


def latest_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Only each case's latest run (run ids sort by their UTC start time)."""
    if df.empty:
        return df
    latest = df.groupby(["study", "case_id"])["run_id"].transform("max")
    return df[df["run_id"] == latest]


def params_of(df: pd.DataFrame) -> pd.Series:
    """Each row's params as a dict."""
    return df["params"].map(json.loads)


def with_params(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` plus a ``param_<name>`` column per key of the ``params`` JSON objects."""
    parsed = params_of(df)
    out = df.copy()
    for name in sorted({name for params in parsed for name in params}):
        out[f"param_{name}"] = parsed.map(lambda p, name=name: p.get(name))
    return out


def ok_repeats(df: pd.DataFrame) -> pd.DataFrame:
    """The ok timed-repeat rows of each case's latest run."""
    rows = latest_runs(df)
    return rows[(rows["status"] == "ok") & (rows["repeat"] >= 0).fillna(False)]


def select(df: pd.DataFrame, metric: str | None = None, **where) -> pd.DataFrame:
    """The ok timed-repeat rows of ``metric`` whose columns equal ``where``'s values;
    ``param_<name>=value`` matches a key of the params JSON (``None``: key absent)."""
    rows = ok_repeats(df)
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
        parsed = params_of(rows)
        for key, value in params.items():
            name = key.removeprefix("param_")
            rows = rows[parsed.map(lambda p, name=name, value=value: p.get(name) == value)]
            parsed = parsed[rows.index]
    return rows


@dataclass(frozen=True)
class Stat:
    """A case's figure: median, min and max over ``count`` repeats, in ``unit``;
    ``values`` are the repeats' values in repeat order (for paired comparisons)."""

    median: float
    low: float
    high: float
    count: int
    unit: str
    values: tuple[float, ...] = ()
    # The result rows behind ``values``: (study, case_id, metric) of each case read, so
    # that anyone can recompute the figure from the CSVs; () where it is derived. Not part
    # of equality: the same numbers are the same figure.
    sources: tuple[tuple[str, str, str], ...] = field(default=(), compare=False)
    # A derived figure's rows (a sum of two metrics, bytes over samples, a count of cases):
    # what it was computed from, though its values are not theirs.
    derived_from: tuple[tuple[str, str, str], ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        return format_value(self.median, self.unit)

    @property
    def spread(self) -> str:
        """``"1.1k–1.3k samples/s"``-style range of the repeats."""
        low = format_value(self.low, self.unit)
        high = format_value(self.high, self.unit)
        return f"{low}{DASH}{high}"

    @classmethod
    def of(cls, rows: pd.DataFrame) -> Stat:
        """The Stat of ``rows`` (one metric of one case: ok timed repeats)."""
        ordered = rows.sort_values("repeat", kind="stable")
        values = ordered["value"].astype(float)
        found = cls(float(values.median()), float(values.min()), float(values.max()),
                    int(values.size), str(ordered["unit"].iloc[0]),
                    tuple(float(v) for v in values), row_sources(ordered))
        seen = _SEEN_STATS.get()
        if seen is not None:
            seen.append((found, ordered.iloc[0]))
        return found


# Where ``Stat.of`` reports each figure it computes while ``stats_read()`` is open: every
# median a figure draws comes through it, so the figure's rows are those it reported.
_SEEN_STATS: contextvars.ContextVar[list | None] = contextvars.ContextVar("seen_stats",
                                                                          default=None)


@contextlib.contextmanager
def _collecting(var: contextvars.ContextVar) -> Iterator[list]:
    """A list that ``var`` points at while the block runs, for what is reported into it."""
    found: list = []
    token = var.set(found)
    try:
        yield found
    finally:
        var.reset(token)


def stats_read() -> contextlib.AbstractContextManager[list]:
    """``with stats_read() as seen:`` every ``Stat`` computed inside, with the first row of
    the rows it was computed from, appended to ``seen`` as ``(stat, row)``."""
    return _collecting(_SEEN_STATS)


# Where a figure that computes more medians than it draws (the highest few of many cases,
# say) reports the ones it drew (``mark_drawn``) while ``stats_drawn()`` is open.
_DRAWN_STATS: contextvars.ContextVar[list | None] = contextvars.ContextVar("drawn_stats",
                                                                           default=None)


def stats_drawn() -> contextlib.AbstractContextManager[list]:
    """``with stats_drawn() as drawn:`` every ``Stat`` a figure drawn inside reports as
    drawn (``mark_drawn``); empty where it drew every median it read."""
    return _collecting(_DRAWN_STATS)


def mark_drawn(stats) -> None:
    """Report ``stats`` (Stats, None skipped) as the medians a figure drew, where it reads
    more than it shows: its rows table (``report.figures.figure_rows``) then lists these."""
    drawn = _DRAWN_STATS.get()
    if drawn is not None:
        drawn.extend(found for found in stats if isinstance(found, Stat))


def row_sources(rows: pd.DataFrame) -> tuple[tuple[str, str, str], ...]:
    """(study, case_id, metric) of every case among ``rows``, in first-seen order."""
    if not {"study", "case_id", "metric"} <= set(rows.columns):
        return ()
    return tuple(dict.fromkeys(
        (str(study), str(case), str(metric))
        for study, case, metric in zip(rows["study"], rows["case_id"], rows["metric"])))


def stat(df: pd.DataFrame, metric: str, **where) -> Stat:
    """The median, min and max of ``metric`` over the matching rows; raises
    ``MissingResultError`` naming the metric and the filter when there are none."""
    rows = select(df, metric, **where)
    if rows.empty:
        described = ", ".join(f"{k}={v!r}" for k, v in where.items())
        raise MissingResultError(f"no ok result for {metric}" + (f" with {described}" if
                                                                 described else ""))
    return Stat.of(rows)


def stat_columns(found: Stat) -> dict[str, object]:
    """A figure's row's numbers for a reader to check a mark against: the median and the
    spread of the repeats (min to max; a dash for one repeat) as text, and their count."""
    return {"median": str(found), "spread": found.spread if found.count > 1 else DASH,
            "n": found.count}


def resident_fractions(df: pd.DataFrame) -> pd.DataFrame:
    """The cache-controlled timed repeats' rows, one per run, case and repeat, each with the
    fraction of the dataset's files in the page cache as the repeat started
    (``resident_fraction``): the evidence that cold was cold and warm was warm."""
    rows = df[(df["repeat"] >= 0) & df["resident_fraction"].notna() & (df["cache"] != "")]
    return rows.drop_duplicates(["run_id", "case_id", "repeat"])


# What a row of ``resident_fraction_rows`` holds, for the table under its figure.
RESIDENT_ROWS_CAPTION = ("One row per cache state: the median of the repeats' resident "
                         "fractions at their start, their spread (lowest to highest), n (the "
                         "repeats that ran) and the cases.")


def resident_fraction_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Per cache state, what the resident-fraction figure draws (a point per repeat of
    ``resident_fractions``): the median, the spread (min to max) and the count of the
    repeats' resident fractions, and the cases they belong to."""
    rows = resident_fractions(df)
    out = []
    for cache in ordered(rows["cache"], ("cold", "warm")):
        part = rows[rows["cache"] == cache]
        values = part["resident_fraction"].astype(float)
        found = Stat(float(values.median()), float(values.min()), float(values.max()),
                     int(values.size), "ratio", tuple(values))
        out.append({"cache": cache, "metric": "resident_fraction", **stat_columns(found),
                    "cases": part["case_id"].nunique()})
    return pd.DataFrame(out, columns=["cache", "metric", "median", "spread", "n", "cases"])


def summed_stat(df: pd.DataFrame, metrics: Sequence[str], **where) -> Stat:
    """The Stat of the per-repeat sum of ``metrics`` (e.g. preload plus epoch seconds),
    summing within each repeat so that pairs stay paired."""
    per_metric = []
    sources: tuple[tuple[str, str, str], ...] = ()
    for metric in metrics:
        rows = select(df, metric, **where)
        if rows.empty:
            raise MissingResultError(f"no ok result for {metric} with {where}")
        per_metric.append(rows.groupby("repeat")["value"].median())
        unit = str(rows["unit"].iloc[0])
        sources += row_sources(rows)
    total = sum(per_metric[1:], per_metric[0]).dropna().sort_index()
    return Stat(float(total.median()), float(total.min()), float(total.max()), int(total.size),
                unit, tuple(float(v) for v in total), derived_from=sources)


# Later cold repeats at least this much faster than the first (median over a study's cold
# cases) mean a cache below the guest's page cache served them: the host's, on a VM.
HOST_CACHE_MARGIN = 0.05


def cold_repeats(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Each cold case reading ``metric`` with at least two repeats: its first timed repeat
    apart from the later ones. Every repeat starts from evicted, checked files, so a first
    repeat slower than the later ones is the mark of a cache outside this guest (the VM's
    host) that the eviction cannot reach. Columns: case_id, format, encoding, n, first,
    later_median, later_over_first, resident_before (the most any repeat started with) and
    resident_after (the most any ended with; NaN where not recorded), unit."""
    rows = select(df[df["cache"] == "cold"], metric)
    after = select(df[df["cache"] == "cold"], "resident_fraction_after")
    columns = ["case_id", "format", "encoding", "n", "first", "later_median",
               "later_over_first", "resident_before", "resident_after", "unit"]
    table = []
    for case_id, case in rows.groupby("case_id", sort=True):
        case = case.sort_values("repeat", kind="stable")
        if len(case) < 2:
            continue
        first = float(case["value"].iloc[0])
        later = float(case["value"].iloc[1:].median())
        ended = after.loc[after["case_id"] == case_id, "value"]
        table.append({
            "case_id": case_id, "format": case["format"].iloc[0],
            "encoding": case["encoding"].iloc[0], "n": len(case), "first": first,
            "later_median": later, "later_over_first": later / first if first else math.nan,
            "resident_before": float(case["resident_fraction"].max()),
            "resident_after": float(ended.max()) if len(ended) else math.nan,
            "unit": str(case["unit"].iloc[0]),
        })
    return pd.DataFrame(table, columns=columns)


def host_cache_detected(table: pd.DataFrame) -> bool | None:
    """Whether ``cold_repeats``' cases show a cache below the guest: their later repeats'
    median at least ``HOST_CACHE_MARGIN`` faster than the first, over the cases' median.
    None: no case had two repeats. False never excludes such a cache: it was not seen."""
    if table.empty:
        return None
    return bool(table["later_over_first"].median() >= 1 + HOST_CACHE_MARGIN)


def summary_table(df: pd.DataFrame, metric: str, by: Sequence[str]) -> pd.DataFrame:
    """Per group of ``by`` columns: median, low, high, repeats of ``metric``, the median
    resident fraction the repeats started with, and the group's ``Stat``."""
    rows = select(df, metric)
    columns = [*by, "median", "low", "high", "repeats", "resident_fraction", "stat"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    groups = []
    for key, part in rows.groupby(list(by), dropna=False, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        value = Stat.of(part)
        groups.append({**dict(zip(by, key)), "median": value.median, "low": value.low,
                       "high": value.high, "repeats": value.count,
                       "resident_fraction": float(part["resident_fraction"].median()),
                       "stat": value})
    return pd.DataFrame(groups, columns=columns)


def medians_table(df: pd.DataFrame, metrics: Sequence[str], by: Sequence[str]) -> pd.DataFrame:
    """A wide table of medians: one row per group of ``by`` columns that measured any of
    ``metrics``, one column per metric, its median over the group's repeats
    (``summary_table``'s); NaN where the group did not measure it."""
    keys = list(by)
    table = None
    for metric in metrics:
        part = summary_table(df, metric, keys)
        if part.empty:
            continue
        part = part.set_index(keys)["median"].rename(metric)
        table = part.to_frame() if table is None else table.join(part, how="outer")
    if table is None:
        return pd.DataFrame(columns=[*keys, *metrics])
    table = table.reset_index()
    for metric in metrics:
        if metric not in table:
            table[metric] = np.nan
    return table[[*keys, *metrics]]


def ratio_interval(top: Stat, other: Stat, *, resamples: int = BOOTSTRAP_RESAMPLES,
                   level: float = INTERVAL_LEVEL, seed: int = 0,
                   paired: bool | None = None) -> tuple[float, float, float]:
    """(ratio of medians, low, high): the bootstrap interval of ``top.median /
    other.median``. Paired (repeat pairs resampled: repeat i with repeat i, the same moment
    of one measurement) only for two figures of one case's repeats (``one_case``; ``paired``
    None, the default) or where ``paired`` says so, and then with equal repeat counts;
    otherwise each side's repeats are resampled on their own, all of them: two cases run at
    different times, so repeat i of one says nothing of repeat i of the other. Figures
    built without sources (no case behind them) pair with equal counts. With fewer than
    ``MIN_PAIRED_REPEATS`` repeats on either side the interval is (-inf, inf): undecided."""
    ratio = top.median / other.median if other.median else float("nan")
    a, b = np.asarray(top.values, dtype=float), np.asarray(other.values, dtype=float)
    if min(len(a), len(b)) < MIN_PAIRED_REPEATS:
        return ratio, float("-inf"), float("inf")
    rng = np.random.default_rng(seed)
    if paired is None:
        paired = one_case(top, other) or not (top.sources or other.sources)
    if paired and len(a) == len(b):
        picks = rng.integers(0, len(a), size=(resamples, len(a)))
        picks_a = picks_b = picks
    else:
        picks_a = rng.integers(0, len(a), size=(resamples, len(a)))
        picks_b = rng.integers(0, len(b), size=(resamples, len(b)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.median(a[picks_a], axis=1) / np.median(b[picks_b], axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return ratio, float(low), float(high)


def one_case(top: Stat, other: Stat) -> bool:
    """Both figures are read from the same one case's rows (two metrics of its repeats):
    only then was repeat i of one taken together with repeat i of the other."""
    cases = {(study, case) for study, case, _ in (*top.sources, *other.sources)}
    return len(cases) == 1 and bool(top.sources) and bool(other.sources)


def unpaired_ratio_interval(top: Stat, other: Stat, **options) -> tuple[float, float, float]:
    """``ratio_interval`` with each side's repeats resampled on their own: for two cases,
    whose repeats were taken at different times, so that repeat i of one says nothing of
    repeat i of the other."""
    return ratio_interval(top, other, paired=False, **options)


def default_builds(df: pd.DataFrame) -> pd.DataFrame:
    """Rows about default builds only (no knob variant's ``dataset_name`` in params)."""
    if df.empty:
        return df
    return df[params_of(df).map(lambda p: "dataset_name" not in p)]


def default_open(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of cases that opened their dataset with the format's default options."""
    if df.empty:
        return df
    return df[df["params"].map(lambda text: not open_options(text))]


def dataset_names(df: pd.DataFrame) -> pd.Series:
    """The dataset directory a row is about: ``<format>-<encoding>`` or a variant's name."""
    named = params_of(df).map(lambda p: p.get("dataset_name"))
    default = df["format"] + "-" + df["encoding"]
    return named.where(named.notna(), default).astype(str)


def failed_cases(df: pd.DataFrame, *, study: str | None = None) -> pd.DataFrame:
    """Cases whose latest run failed, timed out or was skipped, with the error's last
    line."""
    rows = latest_runs(df)
    if study is not None:
        rows = rows[rows["study"] == study]
    rows = rows[rows["status"] != "ok"].drop_duplicates(["study", "case_id"])
    errors = rows["error"].map(lambda text: text.strip().splitlines()[-1] if text.strip() else "")
    return rows.assign(error=errors)[["study", "case_id", "status", "error"]].reset_index(
        drop=True)


def format_order() -> list[str]:
    """The formats registry's order."""
    from .formats import FORMATS

    return list(FORMATS)


def ordered(values, order: Sequence[str]) -> list[str]:
    """``values`` (unique) sorted by ``order``; unknown values after, alphabetically."""
    rank = {name: i for i, name in enumerate(order)}
    return sorted(set(values), key=lambda v: (rank.get(v, len(rank)), str(v)))


def sort_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Rows in encoding order, then the formats registry's order, then as they came."""
    if table.empty:
        return table
    keys = {}
    if "encoding" in table:
        keys["encoding"] = {name: i for i, name in enumerate(ENCODING_ORDER)}
    if "format" in table:
        keys["format"] = {name: i for i, name in enumerate(format_order())}
    ranked = table.assign(**{f"_rank_{c}": table[c].map(lambda v, o=o: o.get(v, len(o)))
                             for c, o in keys.items()})
    ranked = ranked.sort_values([f"_rank_{c}" for c in keys], kind="stable")
    return ranked.drop(columns=[f"_rank_{c}" for c in keys]).reset_index(drop=True)


def best_row(table: pd.DataFrame, column: str = "median", *, lowest: bool = False) -> pd.Series:
    """The row with the highest (``lowest``: smallest) ``column``."""
    index = table[column].idxmin() if lowest else table[column].idxmax()
    return table.loc[index]


# -- one comparison, one number: the measurement key ------------------------------------
# The parts of a throughput measurement that decide its number (``measurement_key``).
KEY_FIELDS = ("path", "workers", "start_method", "dataset", "encoding", "decoder",
              "transform", "cache", "order", "batch_size", "timed", "conditions")
# Params that are key fields of their own, or name a comparison rather than a condition of
# it (a target groups paths; the peers' interpreter does not change our loaders' work).
_NOT_CONDITIONS = frozenset({"start_method", "decode", "transform", "dataset_name",
                             "timed_region", "target", "environment"})
# The targets study times registry loader paths under metric prefixes
# (``studies.targets.cases._registry_paths``): the loader path each prefix is.
TARGET_PATH_PREFIXES = {
    "process_prefetcher": "lazy/process", "torch_process_prefetcher": "lazy/process",
    "torch_thread_prefetcher": "lazy/thread", "torch_dataloader": "lazy/torch",
    "pickled_baseline": "lazy/pickled_baseline", "tf_data_autotune": "lazy/tf_data",
}
# Throughput metrics that time something other than the study's steady throughput, by
# what they time (the peers' fresh first epoch has worker start-up inside).
TIMED_BY_METRIC = {"epoch1_samples_per_s": "first epoch, start-up inside"}
THROUGHPUT_METRICS = ("samples_per_s", "later_epochs_samples_per_s", *TIMED_BY_METRIC)


def _throughput_path(metric: str) -> tuple[str | None, str] | None:
    """(loader path named by the metric or None, timed region) of a samples/s metric,
    None for any other metric."""
    if metric in THROUGHPUT_METRICS:
        return None, TIMED_BY_METRIC.get(metric, "")
    prefix, _, rest = metric.rpartition(".")
    if rest != "samples_per_s" or not prefix:
        return None
    if prefix.startswith("epoch") and prefix[5:].isdigit():  # out_of_core's epoch<n>.
        return None, f"epoch {prefix[5:]}"
    return TARGET_PATH_PREFIXES.get(prefix, prefix), ""


def _default_start_method(path: str) -> str | None:
    """The start method a registry loader path uses when a case names none."""
    from .loaders.paths import LOADER_PATHS

    known = LOADER_PATHS.get(path.rpartition("/")[2])
    return known.start_method if known is not None else None


def measurement_key(row: Mapping) -> tuple[str, ...] | None:
    """The canonical key of a throughput row (``KEY_FIELDS``, as strings), or None for a
    row of another metric. Two rows with one key measure the same thing, so they must agree
    whichever study took them.

    What the columns do not say comes from the params: the start method, the decoder
    (``decode``), the transform, the dataset (``dataset_name``, else format-encoding) and
    ``timed_region`` where a case times something other than its steady throughput (an
    epoch with its start-up inside); a path's default start method where none is named.
    Every other param (an emulated compute time, a round trip, a budget) is a condition:
    rows that differ in one are different keys."""
    found = _throughput_path(str(row["metric"]))
    if found is None:
        return None
    named, timed = found
    params = row["params"] if isinstance(row["params"], Mapping) else json.loads(row["params"])
    prefetcher = str(row["prefetcher"] or "none")
    path = named if named is not None else f"{row['loader']}/{prefetcher}"
    workers = row["workers"]
    workers = "" if workers is None or pd.isna(workers) else str(int(workers))
    start_method = params.get("start_method") or _default_start_method(path)
    conditions = ",".join(f"{k}={params[k]}" for k in sorted(params)
                          if k not in _NOT_CONDITIONS and not k.startswith("knob_"))
    return (path, workers, str(start_method or ""),
            str(params.get("dataset_name") or f"{row['format']}-{row['encoding']}"),
            str(row["encoding"]), str(params.get("decode") or ""),
            str(params.get("transform") or ""), str(row["cache"]), str(row["access"]),
            "" if pd.isna(row["batch_size"]) else str(int(row["batch_size"])),
            str(params.get("timed_region") or timed), conditions)


def key_label(key: Sequence[str]) -> str:
    """A key as one line: ``lazy/process ×2 fork, memmap-raw, warm shuffle, batch 256``."""
    parts = dict(zip(KEY_FIELDS, key))
    path = parts["path"] + (f" \u00d7{parts['workers']}" if parts["workers"] else "")
    path += f" {parts['start_method']}" if parts["start_method"] else ""
    text = [path, parts["dataset"]]
    text += [f"decode {parts['decoder']}"] if parts["decoder"] else []
    text += [f"transform {parts['transform']}"] if parts["transform"] else []
    text.append(" ".join(p for p in (parts["cache"], parts["order"]) if p))
    text += [f"batch {parts['batch_size']}"] if parts["batch_size"] else []
    text += [f"timed: {parts['timed']}"] if parts["timed"] else []
    text += [parts["conditions"]] if parts["conditions"] else []
    return ", ".join(t for t in text if t)


def keyed_throughput(df: pd.DataFrame) -> pd.DataFrame:
    """The ok timed repeats of every throughput metric (``THROUGHPUT_METRICS``, targets'
    ``<path>.samples_per_s``), with a ``key`` column (``measurement_key``)."""
    rows = ok_repeats(df)
    rows = rows[rows["metric"].map(lambda m: _throughput_path(str(m)) is not None)]
    if rows.empty:
        return rows.assign(key=pd.Series(dtype=object))
    keys = [measurement_key(row) for row in rows.to_dict("records")]
    return rows.assign(key=pd.Series(keys, index=rows.index, dtype=object))


# -- peaks: sampled PSS/USS only where the region was long enough to sample -------------
SAMPLED_PEAK_METRICS = ("peak_pss_bytes", "peak_uss_bytes")
_REPEAT_KEY = ["run_id", "study", "case_id", "repeat"]


def short_peak_regions(df: pd.DataFrame) -> pd.DataFrame:
    """The repeats (``run_id, study, case_id, repeat``) whose timed region was shorter than
    ``bench.metrics.MIN_PEAK_SAMPLES`` sampling periods: their sampled peaks are no peak.
    Rows that say so (``peak_memory_reliable`` 0) and, for runs written before that metric,
    rows whose ``wall_seconds`` is below that many ``peak_memory_sample_gap_s``."""
    from .bench.metrics import MIN_PEAK_SAMPLES

    wanted = ("peak_memory_reliable", "wall_seconds", "peak_memory_sample_gap_s")
    rows = df[df["metric"].isin(wanted) & (df["status"] == "ok")]
    if rows.empty:
        return pd.DataFrame(columns=_REPEAT_KEY)
    table = rows.pivot_table(index=_REPEAT_KEY, columns="metric", values="value",
                             aggfunc="first")
    table = table.reindex(columns=list(wanted))
    said = table["peak_memory_reliable"]
    derived = table["wall_seconds"] < MIN_PEAK_SAMPLES * table["peak_memory_sample_gap_s"]
    short = (said == 0) | (said.isna() & derived)
    return table[short].reset_index()[_REPEAT_KEY]


def reliable_peaks(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without the sampled peak rows (``SAMPLED_PEAK_METRICS``) of repeats whose region
    was too short to sample (``short_peak_regions``): what a peak-memory figure may draw."""
    short = short_peak_regions(df)
    if short.empty:
        return df
    marked = df[_REPEAT_KEY].merge(short.assign(_short=True), how="left", on=_REPEAT_KEY)
    drop = marked["_short"].fillna(False).to_numpy(dtype=bool) & df["metric"].isin(
        SAMPLED_PEAK_METRICS).to_numpy()
    return df[~drop]
