"""The correctness study's table, figure and findings: per recipe, whether each property
holds, read from what it delivered."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd
from matplotlib.figure import Figure

from ...plots import empty_figure
from ...recipes import RECIPES
from ...results import Results, latest_runs
from ..base import FigureSpec
from .cases import COMPARED_SAMPLES, NO_WORKER_COUNT, RANK_COUNTS, REFERENCE_WORKERS, WORKER_COUNTS
from .grid import NAME
from .measures import RANK_CORRELATION_LIMIT, correlated

QUESTION = ("Which loaders deliver every sample exactly once, with independent randomness, "
            "deterministically, and resume exactly?")

# A share of draws (or positions) counts as "the same" at or above SAME, as "distinct" at
# or below DISTINCT: independent draws coincide almost never, draws seeded alike always.
SAME = 0.999
DISTINCT = 0.02
# A delivered order is shuffled when its rank correlation with the stored order is within
# this of 0 and no run of consecutive stored samples is longer than SHUFFLED_RUN (a full
# shuffle's longest run is 1 or 2; a shard read whole shows the shard's length).
SHUFFLED_CORRELATION = 0.1
SHUFFLED_RUN = 8

# What each library promises about a second run of the same seed (by loader path). A path
# not listed promises nothing storebench relies on: its rows are measured only.
DETERMINISM_PROMISES = {
    "thread": "promised: order and crops are functions of (seed, epoch, index)",
    "thread_consumer_reads": "promised: order and crops are functions of (seed, epoch, "
                             "index)",
    "process": "promised: order and crops are functions of (seed, epoch, index)",
    "torch": "promised: storebench's sampler and seeded crop, whatever the workers",
    "spdl": "promised by storebench's sampler and seeded crop (SPDL keeps input order)",
    "torchdata": "promised by storebench's sampler and seeded crop",
    "tf_data": "not promised: the path runs with deterministic=False (elements leave in "
               "the order they are ready)",
}

PROPERTIES = ("exactly once", "distinct randomness", "deterministic", "shuffled", "resume")
PROPERTY_COLUMNS = {"exactly once": "exactly_once", "distinct randomness": "randomness",
                    "deterministic": "determinism", "shuffled": "shuffle",
                    "resume": "resume"}
KILLED_WORKER = "killed worker"
# "error": the case itself failed, so nothing was measured (not a property that failed).
VERDICT_COLOURS = {"pass": "#4caf50", "fail": "#e53935", "partial": "#ff9800",
                   "not promised": "#cddc39", "error": "#9575cd", "skipped": "#e0e0e0",
                   "not run": "#f5f5f5", "threads": "#cfd8dc"}


@dataclass(frozen=True)
class Outcome:
    """One property of one recipe: ``verdict`` (a ``VERDICT_COLOURS`` key) and what the
    rows say, in words."""

    verdict: str
    text: str


def _values(case: pd.DataFrame) -> dict[str, float]:
    rows = case[case["repeat"] >= 0] if (case["repeat"] >= 0).any() else case
    return {m: float(v) for m, v in zip(rows["metric"], rows["value"])}


def _settings(values: dict, group: str) -> list[str]:
    found = {m.split(".")[1] for m in values if m.startswith(group + ".")}
    order = [f"workers{n}" for n in WORKER_COUNTS] + [f"ranks{n}" for n in RANK_COUNTS]
    return [s for s in order if s in found]


def _setting_text(setting: str) -> str:
    if setting.startswith("workers"):
        count = setting.removeprefix("workers")
        return f"{count} worker{'' if count == '1' else 's'}"
    return f"{setting.removeprefix('ranks')} ranks"


def exactly_once_outcome(values: dict) -> Outcome:
    """Exact at every setting, or the duplicates, misses, unknown labels and label/pixel
    mismatches of each setting that is not; the padding of rank splits is stated apart."""
    settings = _settings(values, "exactly_once")
    if not settings:
        return Outcome("not run", "no run")
    wrong, padding = [], []
    for setting in settings:
        def get(measure: str, setting: str = setting) -> int:
            return int(values.get(f"exactly_once.{setting}.{measure}", 0))

        parts = [f"{get(m)} {word}" for m, word in (
            ("duplicates", "duplicated"), ("misses", "missed"), ("unknown", "unknown"),
            ("tag_mismatches", "with another sample's pixels")) if get(m)]
        if parts:
            wrong.append(f"{_setting_text(setting)}: {', '.join(parts)}")
        if get("padding"):
            padding.append(f"{get('padding')} padding at {_setting_text(setting)}")
    ran = ", ".join(_setting_text(s) for s in settings)
    note = f" ({'; '.join(padding)}, counted apart)" if padding else ""
    if wrong:
        return Outcome("fail", "; ".join(wrong) + note)
    return Outcome("pass", f"exact at {ran}{note}")


def randomness_outcome(values: dict) -> Outcome:
    """Epochs, workers and ranks draw apart; a pass without set_epoch is recorded, not
    judged (it is what the library does)."""
    problems, good = [], []
    epochs = values.get("randomness.epochs.same_draws")
    if epochs is not None:
        (problems if epochs > DISTINCT else good).append(
            f"{epochs:.0%} of samples drew alike in epochs 0 and 1")
    for setting in _settings(values, "randomness"):
        shared = values.get(f"randomness.{setting}.shared_draws")
        if shared is not None and shared > DISTINCT:
            problems.append(f"{_setting_text(setting)}: {shared:.0%} of draws repeated by "
                            "another sample")
        match = values.get(f"randomness.{setting}.sequence_match_max")
        if match is not None and match > DISTINCT:
            problems.append(f"{_setting_text(setting)}: two ranks drew the same sequence "
                            f"({match:.0%} of positions)")
        correlation = values.get(f"randomness.{setting}.draw_correlation")
        pooled = int(values.get(f"randomness.{setting}.draw_correlation_values", 0))
        if correlation is not None and correlated(correlation, pooled):
            problems.append(f"{_setting_text(setting)}: ranks' draws correlate "
                            f"({correlation:+.3f})")
        elif correlation is not None and setting.startswith("ranks"):
            good.append(f"{_setting_text(setting)}: correlation {correlation:+.3f}")
    forgot = values.get("randomness.no_set_epoch.same_draws")
    order = values.get("randomness.no_set_epoch.same_order")
    if forgot is None:
        without = "no set_epoch to forget: the loader advances its epoch itself"
    elif forgot >= SAME and (order or 0) >= SAME:
        without = "without set_epoch an epoch repeats the last one's order and draws"
    else:
        without = (f"without set_epoch: {order or 0:.0%} of the order and {forgot:.0%} of "
                   "draws repeat")
    if not problems and not good:
        return Outcome("not run", without)
    if problems:
        return Outcome("fail", "; ".join(problems) + f" ({without})")
    return Outcome("pass", f"independent draws ({without})")


def determinism_outcome(values: dict, loader: str) -> Outcome:
    promise = DETERMINISM_PROMISES.get(loader, "no promise storebench relies on")
    found = []
    for what, text in (("same_workers", f"{REFERENCE_WORKERS} workers again"),
                       ("other_workers", "1 worker")):
        order = values.get(f"determinism.{what}.same_order")
        draws = values.get(f"determinism.{what}.same_draws")
        if order is None or draws is None:
            continue
        found.append((text, order >= SAME and draws >= SAME,
                      f"{text}: {order:.0%} of the order, {draws:.0%} of draws alike"))
    if not found:
        return Outcome("not run", promise)
    if loader in NO_WORKER_COUNT:
        promise += f"; {NO_WORKER_COUNT[loader]}"
    if all(same for _, same, _ in found):
        return Outcome("pass", "same order and draws with " + " and ".join(
            text for text, _, _ in found) + f" ({promise})")
    verdict = "fail" if promise.startswith("promised") else "not promised"
    return Outcome(verdict, "; ".join(detail for _, _, detail in found) + f" ({promise})")


def shuffle_outcome(values: dict) -> Outcome:
    correlation = values.get("shuffle.storage_rank_correlation")
    run = values.get("shuffle.longest_stored_run")
    if correlation is None or run is None:
        return Outcome("not run", "")
    text = f"rank correlation with stored order {correlation:+.3f}, longest stored run {run:.0f}"
    # On a short epoch a full shuffle's correlation strays by ~1/sqrt(n): three of those
    # are noise, not order.
    delivered = values.get(f"exactly_once.workers{REFERENCE_WORKERS}.delivered", 0)
    noise = 3 / math.sqrt(delivered) if delivered else 0.0
    shuffled = abs(correlation) <= max(SHUFFLED_CORRELATION, noise) and run <= SHUFFLED_RUN
    return Outcome("pass" if shuffled else "fail", text)


def killed_worker_outcome(values: dict) -> Outcome:
    """What the loader did when its oldest worker process was killed mid-epoch: stopping
    with an error, or carrying on with every sample exactly once, passes (nothing wrong is
    delivered silently); a hang, or carrying on with misses or duplicates, fails."""
    prefix = f"killed_worker.workers{REFERENCE_WORKERS}."
    get = lambda measure: values.get(prefix + measure)  # noqa: E731
    if get("hung") is None:
        return Outcome("not run", "no run")
    if get("hung"):
        return Outcome("fail", f"hung: the epoch had neither ended nor raised "
                               f"{get('timeout_s'):.0f} s after it started")
    if not get("worker_processes"):
        return Outcome("threads", "its workers are threads of the training process: "
                                       "there is no worker process to kill")
    delivered, before = int(get("delivered") or 0), int(get("delivered_before_kill") or 0)
    wrong = [f"{int(get(m) or 0)} {word}" for m, word in (
        ("duplicates", "duplicated"), ("misses", "missed"), ("unknown", "unknown"))
        if get(m)]
    killed = f"killed after {before:,} samples"
    if get("raised"):
        duplicated = int(get("duplicates") or 0) + int(get("unknown") or 0)
        return Outcome("fail" if duplicated else "pass",
                       f"{killed}: stopped with an error after {delivered:,}"
                       + (f"; {duplicated} duplicated or unknown" if duplicated else
                          ", none twice"))
    if wrong:
        return Outcome("fail", f"{killed}: carried on without an error, {', '.join(wrong)}")
    return Outcome("pass", f"{killed}: carried on, every sample exactly once "
                           f"({delivered:,} delivered)")


# The resume study's rows, read by their columns and params (not its module: a study
# stands alone): which loader path and start method a row resumed, and its audit.
RESUME_STUDY = "resume"
RESUME_UNSUPPORTED = "unsupported: "
RESUME_REFUSED = "refused: "


def resume_outcomes(df: pd.DataFrame) -> dict[tuple[str, str], Outcome]:
    """(loader path, start method) -> the resume study's outcome over its scenarios."""
    rows = latest_runs(df[df["study"] == RESUME_STUDY])
    by_path: dict[tuple[str, str], list] = {}
    for _, case in rows.groupby("case_id", sort=False):
        params = json.loads(case["params"].iloc[0])
        loader = case["prefetcher"].iloc[0]
        loader = "" if not isinstance(loader, str) else loader
        key = (loader, str(params.get("start_method") or ""))
        scenario = str(params.get("scenario", "")).replace("_", " ")
        status, error = case["status"].iloc[0], str(case["error"].iloc[0] or "")
        if status == "ok":
            values = case.groupby("metric")["value"].max()
            lost, dup = int(values.get("lost", 0)), int(values.get("duplicated", 0))
            result = ("exact" if not (lost or dup) else f"{lost} lost, {dup} duplicated")
        elif error.startswith(RESUME_UNSUPPORTED):
            result = "unsupported"
        elif error.startswith(RESUME_REFUSED):
            result = "refused"
        elif status == "skipped":
            continue  # not run for that scenario: nothing measured
        else:
            result = status
        by_path.setdefault(key, []).append((scenario, result))
    out = {}
    for key, found in by_path.items():
        results = {r for _, r in found}
        text = "; ".join(f"{s}: {r}" for s, r in found)
        if results == {"unsupported"}:
            out[key] = Outcome("skipped", "unsupported by the library")
        elif results == {"exact"}:
            out[key] = Outcome("pass", f"exact ({', '.join(s for s, _ in found)})")
        elif "exact" in results and results <= {"exact", "refused"}:
            out[key] = Outcome("partial", text)
        else:
            out[key] = Outcome("fail", text)
    return out


def resume_for(recipe, outcomes: dict) -> Outcome:
    method = recipe.start_method or recipe.path.start_method or ""
    key = (recipe.loader, method if recipe.loader == "process" else "")
    found = outcomes.get(key) or next(
        (o for (loader, _), o in outcomes.items() if loader == recipe.loader), None)
    if found is None:
        from ...loaders.peers.ray_data import NO_RESUME, RAY_DATA_PATHS

        if recipe.loader in RAY_DATA_PATHS:
            return Outcome("skipped", f"unsupported by the library: {NO_RESUME}")
        return Outcome("not run", "no resume row for its loader path")
    return Outcome(found.verdict, f"{found.text} (resume study, {recipe.path.label})")


def correctness_table(results: Results | pd.DataFrame) -> pd.DataFrame:
    """One row per recipe: for each property its verdict (``<column>``) and what the rows
    say (``<column>_text``), its unit of parallelism, and the case ids read."""
    df = results.df if isinstance(results, Results) else results
    rows = latest_runs(df[df["study"] == NAME])
    resumes = resume_outcomes(df)
    columns = ["recipe", "label", "parallelism"] + [
        c for p in PROPERTIES for c in (PROPERTY_COLUMNS[p], PROPERTY_COLUMNS[p] + "_text")
    ] + ["killed_worker", "killed_worker_text", "case_id"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for _, case in rows.groupby("case_id", sort=False):
        params = json.loads(case["params"].iloc[0])
        recipe = RECIPES.get(params.get("recipe"))
        if recipe is None or not str(case["case_id"].iloc[0]).startswith("audit:"):
            continue
        status, error = case["status"].iloc[0], str(case["error"].iloc[0] or "")
        row = {"recipe": recipe.name, "label": recipe.label,
               "parallelism": recipe.parallelism, "case_id": case["case_id"].iloc[0]}
        if status != "ok":
            # A failure's traceback ends with what went wrong: its last line says it.
            last = next((line for line in reversed(error.splitlines()) if line.strip()), "")
            outcomes = {p: Outcome("skipped" if status == "skipped" else "error",
                                   f"{status}: {last}") for p in PROPERTIES[:-1]}
            killed = outcomes["exactly once"]
        else:
            values = _values(case)
            outcomes = {"exactly once": exactly_once_outcome(values),
                        "distinct randomness": randomness_outcome(values),
                        "deterministic": determinism_outcome(values, recipe.loader),
                        "shuffled": shuffle_outcome(values)}
            killed = killed_worker_outcome(values)
        row["killed_worker"], row["killed_worker_text"] = killed.verdict, killed.text
        outcomes["resume"] = resume_for(recipe, resumes)
        for name, outcome in outcomes.items():
            row[PROPERTY_COLUMNS[name]] = outcome.verdict
            row[PROPERTY_COLUMNS[name] + "_text"] = outcome.text
        out.append(row)
    table = pd.DataFrame(out, columns=columns)
    order = {name: i for i, name in enumerate(RECIPES)}
    return table.sort_values("recipe", key=lambda s: s.map(order)).reset_index(drop=True)


def verdict_grid(results: Results) -> pd.DataFrame:
    """What the figure draws: one row per recipe, one column per property and the killed
    worker, each cell its verdict."""
    table = correctness_table(results)
    columns = {PROPERTY_COLUMNS[p]: p for p in PROPERTIES} | {"killed_worker": KILLED_WORKER}
    return table[["recipe", *columns]].rename(columns=columns)


def plot_correctness(results: Results) -> Figure:
    """Recipe x property, each cell the verdict read from the delivered samples (green:
    holds; red: fails; orange: partly; grey: skipped or not run, the reason in the table)."""
    from matplotlib.patches import Rectangle

    table = verdict_grid(results)
    if table.empty:
        return empty_figure("no correctness rows")
    fig = Figure(figsize=(11, 0.42 * len(table) + 1.8), layout="constrained")
    ax = fig.add_subplot()
    names = columns = list(PROPERTIES) + [KILLED_WORKER]
    for y, (_, row) in enumerate(table.iterrows()):
        for x, column in enumerate(columns):
            verdict = row[column]
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, edgecolor="white",
                                   facecolor=VERDICT_COLOURS.get(verdict, "#b71c1c")))
            ax.text(x, y, verdict, ha="center", va="center", fontsize="x-small")
    # The killed worker sits beside the properties, apart: it is not counted among them.
    ax.axvline(len(PROPERTIES) - 0.5, color="black", linewidth=1.5)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylim(len(table) - 0.5, -0.5)
    ax.set_xticks(range(len(names)), names, fontsize="small")
    ax.set_yticks(range(len(table)), list(table["recipe"]), fontsize="small")
    ax.tick_params(length=0)
    ax.set_title("read from the delivered samples' labels and crop pixels (resume: the "
                 "resume study's rows; killed worker: SIGKILL to a worker process "
                 "mid-epoch)", fontsize="small")
    fig.suptitle(QUESTION, fontsize="medium")
    return fig


FIGURES = (
    FigureSpec("correctness_properties", "Per recipe, whether each property holds as "
               "read from what it delivered: exactly once (workers and ranks), distinct "
               "randomness, determinism given a seed, a shuffled order, and exact resume "
               "(from the resume study).", plot_correctness, rows=verdict_grid,
               rows_caption="One row per recipe: its verdict on each property the audit "
                            "checks (a cell of the figure)."),
)


def findings(results: Results) -> list[str]:
    table = correctness_table(results)
    if table.empty:
        return []
    out = []
    measured = table[table["exactly_once"].isin(["pass", "fail"])]
    clean = measured[measured.apply(
        lambda r: all(r[PROPERTY_COLUMNS[p]] in ("pass", "not run", "skipped")
                      for p in PROPERTIES), axis=1)]
    if not clean.empty:
        out.append(f"{len(clean)} of {len(measured)} recipes measured hold every property "
                   f"they were measured for: {', '.join(clean['recipe'])}.")
    for _, row in table.iterrows():
        for prop in PROPERTIES:
            column = PROPERTY_COLUMNS[prop]
            if row[column] in ("fail", "partial", "not promised"):
                out.append(f"{row['recipe']}: {prop}: {row[column]}: {row[column + '_text']}.")
        if row["killed_worker"] == "fail":
            out.append(f"{row['recipe']}: {KILLED_WORKER}: fail: {row['killed_worker_text']}.")
    skipped = table[table["exactly_once"] == "skipped"]
    for _, row in skipped.iterrows():
        out.append(f"{row['recipe']}: not run here: {row['exactly_once_text']}.")
    forgot = measured[measured["randomness_text"].str.contains("repeats the last one's")]
    if not forgot.empty:
        out.append("Without set_epoch, an epoch repeats the last one's order and draws in "
                   f"{', '.join(forgot['recipe'])} (the epoch is the sampler's to be told, "
                   "as with torch's DistributedSampler).")
    out.append(f"Draws were compared over the first {COMPARED_SAMPLES:,} samples of a "
               f"second run; ranks' draws count as correlated beyond "
               f"{RANK_CORRELATION_LIMIT} and beyond three standard errors.")
    stopped = measured[measured["killed_worker_text"].str.contains("stopped with an error")]
    if not stopped.empty:
        out.append(f"A worker killed mid-epoch stops the epoch with an error in "
                   f"{', '.join(stopped['recipe'])}: nothing wrong is delivered silently.")
    return out
