"""Numbers as text: every value in a sentence, table or README line is formatted here.

``format_value(1234.0, "samples/s") == "1.23k samples/s"``; ratios as ``2.0×``; fractions as
percentages; markdown tables and bullet lists. Pure functions, no results access.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import pandas as pd

MULTIPLY = "\u00d7"
DASH = "\u2013"
# What a cold row is on a virtual machine: the guest's page cache evicted and checked, while
# a cache in its host may still hold the files (docs/methodology.md, "Cold on a virtual machine").
GUEST_COLD = "guest-cold"


def cache_label(cache: str) -> str:
    """A cache state as a reader sees it: "cold" rows are guest-cold (``GUEST_COLD``)."""
    return GUEST_COLD if cache == "cold" else cache


ENCODING_ORDER = ("raw", "png", "jpeg", "mixed")
ENCODING_NAMES = {"raw": "raw arrays", "png": "PNG", "jpeg": "JPEG", "mixed": "JPEG and PNG"}


def finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def sig(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant figures, without exponent notation."""
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(digits - 1 - magnitude, 0)
    return f"{round(value, decimals):,.{decimals}f}"


def grid_value(value: float) -> str:
    """A grid value as typed: ``2.0`` -> ``"2"``, ``0.5`` -> ``"0.5"``."""
    return f"{float(value):g}"


def si_value(value: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return sig(value / factor) + suffix
    return sig(value)


def format_ratio(ratio: float) -> str:
    """``2.0`` -> ``"2.00×"``: two decimals, so a 5% margin is never rounded away (1.04 is not
    "1.0×"); ten and more without decimals (``"230×"``); below one to two significant
    figures (``"0.25×"``)."""
    if not finite(ratio):
        return "n/a"
    if abs(ratio) >= 10:
        return f"{ratio:,.0f}{MULTIPLY}"
    if abs(ratio) < 1:
        return f"{sig(ratio, 2)}{MULTIPLY}"
    return f"{ratio:.2f}{MULTIPLY}"


def relative_text(ratio: float) -> str:
    """How a throughput compares: ``2.0`` -> ``"2.0× faster than"``, ``0.5`` ->
    ``"2.0× slower than"``."""
    if not finite(ratio) or ratio <= 0:
        return "not comparable with"
    if ratio >= 1:
        return f"{format_ratio(ratio)} faster than"
    return f"{format_ratio(1 / ratio)} slower than"


def format_percent(fraction: float) -> str:
    """``0.873`` -> ``"87%"``; below 1% with one decimal."""
    if not finite(fraction):
        return "n/a"
    percent = 100 * fraction
    if 0 < abs(percent) < 0.1:
        return "<0.1%"
    if 0 < abs(percent) < 1:
        return f"{percent:.1f}%"
    return f"{percent:.0f}%"


def format_percent_beside(fraction: float, bar: float) -> str:
    """``format_percent``, with one or two decimals where a value on either side of ``bar``
    would otherwise read as the bar itself (0.949 against 0.95: "94.9%", not "95%")."""
    text = format_percent(fraction)
    if fraction == bar or text != format_percent(bar):
        return text
    for digits in (1, 2):
        text = f"{100 * fraction:.{digits}f}%"
        if text != f"{100 * bar:.{digits}f}%":
            break
    return text


def signed_bytes(value: float) -> str:
    """``+1.2 MB`` / ``-57.3 kB``: a difference in bytes with its sign."""
    if not finite(value):
        return "n/a"
    return ("+" if value >= 0 else "-") + format_value(abs(value), "bytes")


def format_value(value: float, unit: str) -> str:
    """A value in one of the schema's units, to three significant figures with a readable
    prefix: ``format_value(1234.0, "samples/s") == "1.23k samples/s"``."""
    if not finite(value):
        return "n/a"
    value = float(value)
    if unit == "bytes":
        for factor, suffix in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if abs(value) >= factor:
                return f"{sig(value / factor)} {suffix}"
        return f"{value:.0f} B"
    if unit == "s":
        if value == 0:
            return "0 s"
        if abs(value) < 1e-3:
            return f"{sig(value * 1e6)} \u00b5s"
        if abs(value) < 1:
            return f"{sig(value * 1e3)} ms"
        return f"{sig(value)} s"
    if unit == "MB/s":
        return f"{sig(value / 1e3)} GB/s" if abs(value) >= 1e3 else f"{sig(value)} MB/s"
    if unit == "GB/s":
        return f"{sig(value)} GB/s"
    if unit in ("samples/s", "IOPS"):
        return f"{si_value(value)} {unit}"
    if unit == "count":
        return f"{value:,.0f}"
    if unit == "ratio":
        return sig(value)
    return f"{sig(value)} {unit}".strip()


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


def repeats_text(*stats) -> str:
    counts = sorted({s.count for s in stats})
    if len(counts) == 1:
        return f"median of {counts[0]} repeat{'s' if counts[0] != 1 else ''}"
    return "medians of " + " and ".join(str(c) for c in counts) + " repeats"


def faster_sentence(subject: str, other: str, subject_stat, other_stat, *,
                    verb: str = "reads", condition: str = "") -> str:
    """``"memmap reads 2.0× faster than rawfiles warm (median of 5 repeats: 2k vs 1k
    samples/s)"``, for a metric where higher is better; says "slower" when it is."""
    comparison = relative_text(subject_stat.median / other_stat.median)
    condition = f" {condition}" if condition else ""
    return (f"{subject} {verb} {comparison} {other}{condition} "
            f"({repeats_text(subject_stat, other_stat)}: {subject_stat} vs {other_stat})")



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
            out[column] = values.map(lambda v: f"{sig(v)}{MULTIPLY}" if finite(v) else "")
        elif column in GRID_COLUMNS:
            out[column] = values.map(grid_value)
        elif column in units or (column in METRIC_UNITS and METRIC_UNITS[column] != "ratio"):
            unit = units.get(column, METRIC_UNITS.get(column))
            out[column] = values.map(lambda v, unit=unit: format_value(v, unit))
        elif pd.api.types.is_float_dtype(values):
            out[column] = values.map(lambda v: sig(v) if finite(v) else "")
    return out


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
