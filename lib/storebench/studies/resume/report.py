"""The resume study's table, figure and findings: per path and scenario, what an epoch killed
and restored delivered."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...plots import empty_figure, log_axis
from ...results import Results, latest_runs
from ...text import format_value
from ..base import FigureSpec
from .cases import REFUSED, RESUME_PATHS, SCENARIOS, UNSUPPORTED, WORKERS, audit_outcome
from .grid import NAME

SCENARIO_TEXT = {"same_workers": "same workers", "workers_changed": f"workers {WORKERS}\u21941",
                 "ranks_2_to_3": "2 \u2192 3 ranks", "ranks_3_to_2": "3 \u2192 2 ranks"}
# Over a case's repeats: the worst audit, every kill, the median cost.
WORST = {"lost": "max", "duplicated": "max", "unknown_samples": "max", "in_order": "min",
         "exact": "min", "kills": "sum", "mid_batch_kills": "sum"}
METRICS = ("lost", "duplicated", "unknown_samples", "in_order", "exact", "kills",
           "mid_batch_kills", "checkpoint_bytes", "checkpoint_save_s",
           "restart_to_first_batch_s")


def resume_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per path x scenario: ``outcome`` (``exact``, ``N lost, M duplicated``,
    ``exact samples, another order``, ``refused`` (the restore raised), ``unsupported``,
    ``skipped``, ``failed``), ``reason``
    and the medians of ``METRICS``. A path that claims nothing is ``unsupported`` in every
    scenario."""
    rows = latest_runs(df[df["study"] == NAME])
    columns = ["path", "label", "scenario", "outcome", "reason", *METRICS, "case_id"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for case_id, case in rows.groupby("case_id", sort=False):
        params = json.loads(case["params"].iloc[0])
        path = RESUME_PATHS.get(params.get("path"))
        if path is None:
            continue
        values = {m: float(case.loc[case["metric"] == m, "value"].agg(WORST.get(m, "median")))
                  for m in METRICS if (case["metric"] == m).any()}
        status, error = case["status"].iloc[0], str(case["error"].iloc[0] or "")
        if status == "ok":
            in_order = values.get("in_order")
            outcome = audit_outcome(int(values["lost"]), int(values["duplicated"]),
                                    int(values.get("unknown_samples", 0)),
                                    None if in_order is None else bool(in_order))
            reason = ""
        elif status == "skipped" and error.startswith(UNSUPPORTED):
            outcome, reason = "unsupported", error[len(UNSUPPORTED):]
        elif status == "skipped" and error.startswith(REFUSED):
            outcome, reason = "refused", error[len(REFUSED):]
        else:
            outcome, reason = status, error
        scenarios = SCENARIOS if outcome == "unsupported" else (params["scenario"],)
        for scenario in scenarios:
            out.append({"path": path.name, "label": path.label, "scenario": scenario,
                        "outcome": outcome, "reason": reason,
                        **{m: values.get(m, np.nan) for m in METRICS},
                        "case_id": case_id})
    table = pd.DataFrame(out, columns=columns)
    order = {name: i for i, name in enumerate(RESUME_PATHS)}
    table["_p"] = table["path"].map(order)
    table["_s"] = table["scenario"].map(SCENARIOS.index)
    return table.sort_values(["_p", "_s"]).drop(columns=["_p", "_s"]).reset_index(drop=True)


def outcome_grid(table: pd.DataFrame) -> pd.DataFrame:
    """path label x scenario -> outcome (``not run`` where the study has no row)."""
    if table.empty:
        return pd.DataFrame()
    grid = table.pivot(index="label", columns="scenario", values="outcome")
    labels = [p.label for p in RESUME_PATHS.values() if p.label in grid.index]
    scenarios = [s for s in SCENARIOS if s in grid.columns]
    return grid.reindex(index=labels, columns=scenarios).fillna("not run")


def checkpoint_sizes(table: pd.DataFrame) -> dict[str, float]:
    """Path label -> its median checkpoint size, same workers (``resume_table``'s)."""
    sizes = table[(table["scenario"] == "same_workers") & table["checkpoint_bytes"].notna()]
    found: dict[str, float] = {}
    for label, size in zip(sizes["label"], sizes["checkpoint_bytes"]):
        found.setdefault(label, float(size))
    return found


def resume_rows(df: pd.DataFrame) -> pd.DataFrame:
    """What the resume figure draws, one row per path: each scenario's outcome (a cell of
    the left panel) and its checkpoint size (a bar of the right)."""
    table = resume_table(df)
    grid = outcome_grid(table)
    if grid.empty:
        return pd.DataFrame(columns=["path", "checkpoint bytes"])
    sizes = checkpoint_sizes(table)
    rows = grid.rename(columns=SCENARIO_TEXT).rename_axis(index="path", columns=None)
    rows["checkpoint bytes"] = [format_value(sizes[label], "bytes") if label in sizes
                                else "\u2014" for label in rows.index]
    return rows.reset_index()


OUTCOME_COLOURS = {"exact": "#4caf50", "exact samples, another order": "#cddc39",
                   "unsupported": "#9e9e9e", "skipped": "#e0e0e0", "not run": "#f5f5f5",
                   "failed": "#b71c1c", "timeout": "#b71c1c", "refused": "#ff9800"}
WRONG_COLOUR = "#e53935"


def plot_resume(df: pd.DataFrame) -> Figure:
    """Left: path x scenario, each cell the audit's outcome (green: exact; red: samples
    lost or duplicated; grey: unsupported or not run, the reason in the table). Right: the
    median checkpoint size of each path, same workers (log scale)."""
    table = resume_table(df)
    grid = outcome_grid(table)
    if grid.empty:
        return empty_figure("no resume rows")
    fig = Figure(figsize=(12, 0.45 * len(grid) + 2.2), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[2.2, 1])
    for y, label in enumerate(grid.index):
        for x, scenario in enumerate(grid.columns):
            outcome = grid.loc[label, scenario]
            colour = OUTCOME_COLOURS.get(outcome, WRONG_COLOUR)
            left.add_patch(_cell(x, y, colour))
            left.text(x, y, outcome, ha="center", va="center", fontsize="x-small", wrap=True)
    left.set_xlim(-0.5, len(grid.columns) - 0.5)
    left.set_ylim(len(grid) - 0.5, -0.5)
    left.set_xticks(range(len(grid.columns)), [SCENARIO_TEXT[s] for s in grid.columns],
                    fontsize="small")
    left.set_yticks(range(len(grid)), list(grid.index), fontsize="small")
    left.set_title("the epoch's samples after SIGKILL and restore, audited by content",
                   fontsize="small")
    sizes = checkpoint_sizes(table)
    labels = [label for label in grid.index if label in sizes]
    values = [sizes[label] for label in labels]
    right.barh(range(len(labels)), values, color="C0")
    right.set_yticks(range(len(labels)), labels, fontsize="x-small")
    right.invert_yaxis()
    if values:
        log_axis(right, "x")
    right.set_xlabel("checkpoint bytes (the loader's state)", fontsize="small")
    fig.suptitle("Which loaders resume an epoch exactly after SIGKILL?", fontsize="medium")
    return fig


def _cell(x: float, y: float, colour: str):
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=colour, edgecolor="white")


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]



FIGURES = (
    FigureSpec("resume_exact", "Per loader and scenario, what an epoch SIGKILLed and "
               "restored from its last checkpoint delivered (exact, or samples lost and "
               "duplicated), and each path's checkpoint size.",
               lambda results: plot_resume(results.df),
               rows=lambda results: resume_rows(results.df),
               rows_caption="One row per loader path: each scenario's outcome (a cell of the "
                            "left panel) and its checkpoint size (a bar of the right)."),
)

def findings(results: Results) -> list[str]:
    table = resume_table(results.df)
    if table.empty:
        return []
    out = []
    ran = table[~table["outcome"].isin(["unsupported", "skipped", "failed", "timeout"])]
    for label, mine in ran.groupby("label", sort=False):
        exact = mine[mine["outcome"] == "exact"]
        wrong = mine[mine["outcome"] != "exact"]
        what = _join([SCENARIO_TEXT[s] for s in mine["scenario"]])
        kills = int(mine["kills"].fillna(0).sum())
        if wrong.empty:
            out.append(f"{label} resumed exactly ({what}): after {kills} "
                       f"SIGKILL{'s' if kills != 1 else ''}, every sample once, in the "
                       "uninterrupted epoch's order where one is defined.")
        else:
            bad = "; ".join(f"{SCENARIO_TEXT[s]}: {o}" + (f" ({r})" if r else "")
                            for s, o, r in zip(wrong["scenario"], wrong["outcome"],
                                               wrong["reason"]))
            good = (f", exact with {_join([SCENARIO_TEXT[s] for s in exact['scenario']])}"
                    if not exact.empty else "")
            out.append(f"{label} did not resume exactly after SIGKILL ({bad}){good}.")
    sizes = ran[(ran["scenario"] == "same_workers") & ran["checkpoint_bytes"].notna()]
    if len(sizes) > 1:
        small, large = sizes.loc[sizes["checkpoint_bytes"].idxmin()], sizes.loc[
            sizes["checkpoint_bytes"].idxmax()]
        out.append(f"Checkpoint size of the loader's state runs from "
                   f"{format_value(small['checkpoint_bytes'], 'bytes')} ({small['label']}) to "
                   f"{format_value(large['checkpoint_bytes'], 'bytes')} ({large['label']}).")
    restarts = ran[ran["restart_to_first_batch_s"].notna()]
    if len(restarts) > 1:
        fast = restarts.loc[restarts["restart_to_first_batch_s"].idxmin()]
        slow = restarts.loc[restarts["restart_to_first_batch_s"].idxmax()]
        out.append(f"From a restart's launch (interpreter and imports included) to its first "
                   f"resumed batch: {format_value(fast['restart_to_first_batch_s'], 's')} "
                   f"({fast['label']}, {SCENARIO_TEXT[fast['scenario']]}) to "
                   f"{format_value(slow['restart_to_first_batch_s'], 's')} ({slow['label']}, "
                   f"{SCENARIO_TEXT[slow['scenario']]}).")
    others = table[~table.index.isin(ran.index)].drop_duplicates(["label", "outcome", "reason"])
    for _, row in others.iterrows():
        where = "" if row["outcome"] == "unsupported" else f" ({SCENARIO_TEXT[row['scenario']]})"
        out.append(f"{row['label']}{where}: {row['outcome']}: {row['reason']}")
    return out
