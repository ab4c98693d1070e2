"""The resume study: which loaders resume an epoch exactly after the training process is
SIGKILLed mid-epoch?

Every path that claims mid-epoch resumption (storebench's ProcessPrefetcher under fork and
spawn, ThreadPrefetcher and ``ResumableDataLoader``; torchdata's ``StatefulDataLoader``;
LitData's and MosaicML Streaming's ``StreamingDataLoader``; tf.data iterator checkpoints)
trains one shuffled epoch of the profile's raw set (cut as the peers study's,
``peer_specs``) in a child process that checkpoints every few batches and is SIGKILLed at
seeded points, some mid-batch; a new process restores the last checkpoint each time
(``cases``). The epoch's deliveries are audited by content against an uninterrupted epoch:
samples lost, duplicated, and whether the order is the same. Scenarios: the same worker
count; another worker count at each restart; 2 gloo ranks resumed by 3 and 3 by 2 (where
the path can split its state over ranks). Paths that make no claim (WebDataset, the plain
torch ``DataLoader``) have rows saying ``unsupported`` and why. Each row also records the
checkpoint's size (the loader's state only), the time to save it, and the time from the
restart's launch (interpreter and imports included) to the first resumed batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...bench.case import Case
from ...bench.plan import peer_sets_dir, plan_for
from ...plots import empty_figure, log_axis
from ...results import Results, latest_runs
from ...text import format_value
from ..base import FigureSpec, Study
from .cases import (
    RANK_SCENARIOS,
    REFUSED,
    RESUME_PATHS,
    SCENARIOS,
    UNSUPPORTED,
    WORKERS,
    audit_outcome,
    get_resume_path,
)

NAME = "resume"
CASES = "storebench.studies.resume.cases"
# (batch size, checkpoint every n batches): ci's raw set is 256 samples (16 batches), the
# default profile's cut set 2,048 (32 batches).
COMPACT_KNOBS = (16, 2)
FULL_KNOBS = (64, 4)
# Kills per epoch: two (one mid-batch) where a training process starts in a second; one,
# seeded mid-batch or not, where each start imports a peer library or TensorFlow (seconds
# each), so that the default profile's study stays within about three minutes.
KILLS = {"ours": 2}
OTHER_KILLS = 1
# ci: one of each kind of case, without tf.data, whose every training process imports
# TensorFlow (tens of seconds here; tests/loaders/test_tf_resume.py kills and restores it).
COMPACT = (("process_fork", "same_workers"), ("thread", "workers_changed"),
           ("process_fork", "ranks_3_to_2"), ("torchdata", "same_workers"),
           ("webdataset", "same_workers"))
SCENARIO_TEXT = {"same_workers": "same workers", "workers_changed": f"workers {WORKERS}\u21941",
                 "ranks_2_to_3": "2 \u2192 3 ranks", "ranks_3_to_2": "3 \u2192 2 ranks"}
# Over a case's repeats: the worst audit, every kill, the median cost.
WORST = {"lost": "max", "duplicated": "max", "unknown_samples": "max", "in_order": "min",
         "exact": "min", "kills": "sum", "mid_batch_kills": "sum"}
METRICS = ("lost", "duplicated", "unknown_samples", "in_order", "exact", "kills",
           "mid_batch_kills", "checkpoint_bytes", "checkpoint_save_s",
           "restart_to_first_batch_s")


def _pairs(compact: bool) -> list[tuple[str, str]]:
    if compact:
        return list(COMPACT)
    out = []
    for name, path in RESUME_PATHS.items():
        # A path that claims nothing gets one row: its reason holds for every scenario.
        out += [(name, "same_workers")] if path.unsupported else [(name, s) for s in SCENARIOS]
    return out


def resume_grid(*, profile: str, data_dir: Path | str, repeats: int | None = None
                ) -> list[Case]:
    """Every path x scenario (``COMPACT`` on ci): one case each, one epoch killed and
    resumed; ``repeats`` (the CLI's ``--repeats``) runs that many epochs, each killed at
    points of its own. The plan's repeats do not apply: a case's kills are its
    repetitions, and its outcome is counted, not timed."""
    plan = plan_for(profile)
    batch, every = COMPACT_KNOBS if plan.compact else FULL_KNOBS
    sets = peer_sets_dir(data_dir)
    cases = []
    for name, scenario in _pairs(plan.compact):
        path = get_resume_path(name)
        params = {"path": name, "scenario": scenario, "every": every,
                  "kills": KILLS.get(path.kind, OTHER_KILLS)}
        if path.environment:
            params["environment"] = path.environment
        if path.start_method:
            params["start_method"] = path.start_method
        cases.append(Case(study=NAME, function=f"{CASES}:resume_case", format=path.format,
                          encoding="raw", dataset=str(sets / f"{path.format}-raw"),
                          prefetcher=path.loader, workers=WORKERS, batch_size=batch,
                          access="shuffle", repeats=repeats or 1, warmup=False,
                          timeout_s=plan.timeout_s, params=params))
    return cases


def prepare(*, profile: str, data_dir: Path | str, progress: bool = True) -> None:
    """Build the sets the study reads (``peer_specs``): ours and tf.data's (memmap,
    TFRecord) with this interpreter, the peers' own formats in the peers environment
    (where it is missing, their rows say so)."""
    import subprocess
    import sys

    from ...formats import FORMATS
    from ..peers.study import build_peer_formats

    formats = {path.format for path in RESUME_PATHS.values()}
    ours = sorted(f for f in formats if not getattr(FORMATS.get(f), "PEER", False))
    subprocess.run([sys.executable, "-m", "storebench", "build", "--profile", profile,
                    "--out", str(data_dir), "--peer-sets", "--formats", *ours,
                    *([] if progress else ["--quiet"])], check=True)
    build_peer_formats(profile=profile, data_dir=data_dir, progress=progress,
                       formats=tuple(sorted(formats - set(ours))))


# -- the table ---------------------------------------------------------------------------
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


# -- figure ------------------------------------------------------------------------------
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
    sizes = table[(table["scenario"] == "same_workers") & table["checkpoint_bytes"].notna()]
    labels = [label for label in grid.index if label in set(sizes["label"])]
    values = [float(sizes.loc[sizes["label"] == label, "checkpoint_bytes"].iloc[0])
              for label in labels]
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


# -- findings and guide -------------------------------------------------------------------
def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


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


def guide(results: Results) -> list:
    """"Which loaders resume exactly": the paths that resumed exactly in at least one
    scenario, ranked by how many of the study's scenarios they resumed exactly."""
    from ...guide import Candidate, GuideRow
    from ...results import Stat

    table = resume_table(results.df)
    if table.empty:
        return []
    exact = table[table["outcome"] == "exact"]
    counts = exact.groupby("path", sort=False).size()
    if counts.empty:
        return []
    counts = counts.sort_values(ascending=False, kind="stable")
    # A count's rows: the audit's lost and duplicated samples of each case it counts.
    sources = {path: tuple((NAME, case_id, metric) for case_id in dict.fromkeys(part["case_id"])
                           for metric in ("lost", "duplicated"))
               for path, part in exact.groupby("path", sort=False)}
    candidates = tuple(
        Candidate(name, get_resume_path(name).label,
                  Stat(float(n), float(n), float(n), 1, "count", (float(n),),
                       derived_from=sources[name]))
        for name, n in counts.items())
    best = float(counts.iloc[0])
    runner = float(counts.iloc[1]) if len(counts) > 1 else float("nan")
    tied = tuple(c.label for c in candidates[1:] if c.stat.median == best)
    question = (f"Which loaders resume an epoch exactly after SIGKILL? (scenarios resumed "
                f"exactly of the {len(SCENARIOS)}: same workers, workers changed, "
                f"{len(RANK_SCENARIOS)} world-size changes)")
    return [GuideRow(NAME, question, "exact_scenarios", candidates, False,
                     best / runner, best / runner, best / runner, bool(tied), tied,
                     {"question": "resume"}, "equivalent" if tied else "better")]


STUDY = Study(
    name=NAME,
    question="Which loaders resume an epoch exactly after the training process is killed?",
    grid=resume_grid,
    figures=(
        FigureSpec("resume_exact", "Per loader and scenario, what an epoch SIGKILLed and "
                   "restored from its last checkpoint delivered (exact, or samples lost and "
                   "duplicated), and each path's checkpoint size.",
                   lambda results: plot_resume(results.df)),
    ),
    findings=findings,
    guide=guide,
    notebook="11_resume.ipynb",
    readme_figures=("resume_exact",),
    synthetic_only=True,
    prepare=prepare,
)
