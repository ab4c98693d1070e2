"""Every performance target any study declares (``Study.targets``), across the studies: the
table of them, met or not, with the workload each was measured on, and the figure of each
against its threshold. The study that shows them (``Study.shows_every_target``) gets both in
its README part and on its figures."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..bench.stats import MIN_DECISION_REPEATS
from ..plots import empty_figure, family_handles, question_title
from ..results import Results
from ..studies.base import FigureSpec, TargetMeasure, TargetSpec
from ..studies.shared_rows import dram_copy_GBps
from ..text import DASH, format_percent, format_ratio, markdown_table


def every_target() -> list[tuple[str, TargetSpec]]:
    """(study, target) for every target a study declares, in the studies' run order."""
    from ..studies import STUDIES

    return [(study.name, spec) for study in STUDIES.values() for spec in study.targets]


ALL_TARGET_COLUMNS = ["key", "study", "target", "what", "threshold", "is_fraction",
                      "measured", "value", "low", "high", "repeats", "met", "shortfall",
                      "limiting", "calibration", "workload"]


def measured_workload(results: Results, measured: TargetMeasure) -> str:
    """What the rows a target was read from measured (``Results.workload`` of their study
    and encoding); "not recorded" where the results do not say."""
    if not measured.sources:
        return "not recorded"
    study, case_id, _metric = measured.sources[0]
    rows = results.df[(results.df["study"] == study) & (results.df["case_id"] == case_id)]
    encoding = str(rows["encoding"].iloc[0]) if not rows.empty else None
    return results.workload(study, encoding) or "not recorded"


def all_targets_table(results: Results) -> pd.DataFrame:
    """Every target every study declares, measured or not: met when the 95% interval's
    lower end reaches the threshold, over at least ``MIN_DECISION_REPEATS`` repeats;
    ``shortfall``: how far the median is below it."""
    out = []
    for study, spec in every_target():
        measured = spec.measure(results)
        row = {"key": spec.key, "study": study, "target": spec.name,
               "what": spec.description, "threshold": spec.threshold,
               "is_fraction": spec.is_fraction, "measured": measured is not None,
               "value": np.nan, "low": np.nan, "high": np.nan, "repeats": 0, "met": False,
               "shortfall": np.nan, "limiting": spec.unmeasured,
               "calibration": spec.calibration, "workload": ""}
        if measured is not None:
            row.update(value=measured.value, low=measured.low, high=measured.high,
                       workload=measured_workload(results, measured),
                       repeats=measured.repeats, limiting=measured.limiting,
                       met=bool(measured.repeats >= MIN_DECISION_REPEATS
                                and np.isfinite(measured.low)
                                and measured.low >= spec.threshold),
                       shortfall=max(0.0, 1 - measured.value / spec.threshold))
        out.append(row)
    return pd.DataFrame(out, columns=ALL_TARGET_COLUMNS)


def _text_for(is_fraction: bool) -> Callable[[float], str]:
    return format_percent if is_fraction else format_ratio


def _interval_text(fmt: Callable[[float], str], row) -> str:
    if not row["measured"]:
        return (f"not measured: {row['limiting']}" if row["limiting"]
                else "not measured in these results")
    if not np.isfinite(row["low"]) or row["repeats"] < MIN_DECISION_REPEATS:
        return (f"{fmt(row['value'])} (no interval: fewer than {MIN_DECISION_REPEATS} "
                f"repeats, n={row['repeats']})")
    return (f"{fmt(row['value'])} ({fmt(row['low'])}{DASH}{fmt(row['high'])}, "
            f"n={row['repeats']})")


def target_verdict(row) -> str:
    """``met``, ``unmet`` (the median misses, or the interval reaches below over enough
    repeats), ``undecided`` (the median clears it on too few repeats) or ``not measured``."""
    if not row["measured"]:
        return "not measured"
    if row["met"]:
        return "met"
    if row["shortfall"] > 0 or row["repeats"] >= MIN_DECISION_REPEATS:
        return "unmet"
    return "undecided"


def _met_text(row) -> str:
    verdict = target_verdict(row)
    few = f"; n={row['repeats']}" if row["repeats"] < MIN_DECISION_REPEATS else ""
    if verdict in ("not measured", "met"):
        return {"met": "yes"}.get(verdict, verdict)
    if verdict == "undecided":
        return f"**undecided** (the median clears it{few})"
    if row["shortfall"] > 0:
        return f"**no** ({format_percent(row['shortfall'])} short{few})"
    return "**no** (the interval reaches below)"


def targets_markdown(results: Results, *, calibration: bool | None = None) -> str:
    """A table of every target any study declares, met or not, with the workload each was
    measured on: the machine-calibration targets only (``calibration``), the others only
    (False, the README's), or all (None)."""
    table = all_targets_table(results)
    if calibration is not None:
        table = table[table["calibration"] == calibration]
    if table.empty:
        return "No target is declared."
    shown = pd.DataFrame({
        "target": table["target"],
        "workload": table["workload"],
        "measured (median, 95% interval)": [
            _interval_text(_text_for(row["is_fraction"]), row) for _, row in table.iterrows()],
        "threshold": [f"\u2265 {_text_for(f)(t)}" for f, t in zip(table["is_fraction"],
                                                                table["threshold"])],
        "met": [_met_text(row) for _, row in table.iterrows()],
    })
    return markdown_table(shown)


def readme_text(results: Results, place) -> str:
    """The README's table of the targets (the machine-calibration ones are on the
    methodology page)."""
    return ("**Performance targets** (the targets measured on small synthetic sets calibrate "
            "the machine: [methodology](docs/methodology.md#machine-calibration))\n\n"
            + targets_markdown(results, calibration=False))


# -- the figure ---------------------------------------------------------------------------
def _unmet_caption(table: pd.DataFrame) -> str:
    """One wrapped line per unmet target: what its rows show limits it."""
    import textwrap

    lines = []
    for _, row in table.iterrows():
        if target_verdict(row) != "unmet":
            continue
        why = row["limiting"] or "no limiting factor measured"
        lines += textwrap.wrap(f"{row['target']} (unmet): {why}", 120)
    return "\n".join(lines)


VERDICT_COLOURS = {"met": "#2ca02c", "unmet": "#d62728", "undecided": "#aaaaaa",
                   "not measured": "#ffffff"}


def _target_label(row, df: pd.DataFrame | None) -> str:
    fmt = _text_for(row["is_fraction"])
    measured = fmt(row["value"]) if row["measured"] else "—"
    copy = dram_copy_GBps(df, row["key"]) if df is not None else None
    of = f" of a {copy:.1f} GB/s DRAM copy" if copy else ""
    return f"{row['target']}\n{measured}{of} vs ≥ {fmt(row['threshold'])}"


def plot_target_ratios(table: pd.DataFrame, df: pd.DataFrame | None = None) -> Figure:
    """Every declared target's median against its threshold, as median / threshold on a
    linear axis (1 = the threshold), with its 95% interval; green when met (the interval's
    lower end reaches the threshold), red when not, grey when undecided, an empty bar when
    not measured. A gather target's label names its DRAM copy denominator (from ``df``, the
    rows). Below: what limits each unmet target. ``table``: ``all_targets_table``'s."""
    if table.empty:
        return empty_figure("no target declared")
    caption = _unmet_caption(table)
    caption_lines = caption.count("\n") + 1 if caption else 0
    fig = Figure(figsize=(9, 0.55 * len(table) + 2.4 + 0.16 * caption_lines),
                 layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(table))
    relative = (table["value"] / table["threshold"]).to_numpy(dtype=float)
    verdicts = [target_verdict(row) for _, row in table.iterrows()]
    ax.barh(y, np.nan_to_num(relative), color=[VERDICT_COLOURS[v] for v in verdicts],
            edgecolor="black", linewidth=0.5)
    low = (table["low"] / table["threshold"]).to_numpy(dtype=float)
    high = (table["high"] / table["threshold"]).to_numpy(dtype=float)
    # An interval over fewer repeats than a decision needs is not drawn.
    bounded = (np.isfinite(low) & np.isfinite(high)
               & (table["repeats"].to_numpy() >= MIN_DECISION_REPEATS))
    ax.errorbar(relative[bounded], y[bounded],
                xerr=[relative[bounded] - low[bounded], high[bounded] - relative[bounded]],
                fmt="none", ecolor="black", capsize=2)
    for row_y, (_, row) in zip(y, table.iterrows()):
        if not row["measured"]:
            ax.text(0.02, row_y, "not measured in these results", va="center",
                    fontsize="x-small", color="grey", transform=ax.get_yaxis_transform())
    ax.axvline(1.0, color="black", linewidth=1.2)
    ax.set_yticks(y, [_target_label(row, df) for _, row in table.iterrows()],
                  fontsize="small")
    ax.invert_yaxis()
    ax.set_xlim(0, max(1.2, float(np.nanmax(np.append(high[bounded], relative))) * 1.05)
                if np.isfinite(relative).any() else 1.5)
    ax.set_xlabel("median / threshold, with its 95% interval (1 = the threshold)")
    counts = {v: verdicts.count(v) for v in VERDICT_COLOURS if v in verdicts}
    names = {"met": f"met (interval's lower end ≥ threshold, n ≥ {MIN_DECISION_REPEATS})",
             "unmet": "unmet", "undecided": f"undecided (n < {MIN_DECISION_REPEATS})",
             "not measured": "not measured"}
    # Under the axis title: constrained layout makes room for an axes' legend.
    ax.legend(handles=family_handles({v: VERDICT_COLOURS[v] for v in counts},
                                     {v: f"{names[v]}: {counts[v]}" for v in counts}),
              loc="upper center", bbox_to_anchor=(0.5, -0.09), ncols=3, fontsize="small",
              frameon=False)
    unmet = [row["target"] for _, row in table.iterrows() if target_verdict(row) == "unmet"]
    question_title(fig, "Which performance targets are met?",
                   f"{counts.get('met', 0)} of {len(table)} met"
                   + (f"; unmet: {', '.join(unmet)}." if unmet else "."))
    if caption:
        fig.text(0.01, 0.0, caption, fontsize="x-small", va="bottom", ha="left")
        fig.get_layout_engine().set(rect=(0, 0.16 * caption_lines / fig.get_figheight(),
                                          1, 1 - 0.16 * caption_lines / fig.get_figheight()))
    return fig


def target_rows(results: Results) -> pd.DataFrame:
    """What the targets figure draws, one row per bar: the target, its verdict, its median
    (value), 95% interval and repeats (n), and its threshold."""
    table = all_targets_table(results)
    out = []
    for _, row in table.iterrows():
        fmt = _text_for(row["is_fraction"])
        bounded = (row["measured"] and np.isfinite(row["low"]) and np.isfinite(row["high"])
                   and row["repeats"] >= MIN_DECISION_REPEATS)
        out.append({"study": row["study"], "target": row["target"],
                    "verdict": target_verdict(row),
                    "median": fmt(row["value"]) if row["measured"] else DASH,
                    "interval": f"{fmt(row['low'])}{DASH}{fmt(row['high'])}" if bounded
                    else DASH,
                    "n": int(row["repeats"]), "threshold": f"\u2265 {fmt(row['threshold'])}"})
    return pd.DataFrame(out, columns=["study", "target", "verdict", "median", "interval", "n",
                                      "threshold"])


TARGETS_MET = FigureSpec("targets_met", "Every performance target against its threshold: met, "
                         "unmet or undecided",
                         lambda r: plot_target_ratios(all_targets_table(r), r.df),
                         rows=target_rows,
                         rows_caption="One row per target (a bar): its verdict, its median, "
                                      "95% interval and n, the repeats that ran, against its "
                                      "threshold.")
