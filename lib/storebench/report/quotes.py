"""One number per comparison: every figure the README, the guide page and ``advise`` quote,
checked against the case it comes from.

A ``Quote`` is one figure as a page shows it: a case's median (a ``Stat``), or the ratio of
two. ``quotes(results)`` collects every quote the generated pages draw from the decision
guide, the answer table (``advise``, and storebench's best path against the common
default) and the peers study's comparisons. ``check_quotes`` then holds each to three rules:

- **sourced**: a quote names the result rows it was read from, and its median is what those
  rows give now (a page computed from other rows, or from an older run, fails);
- **one value per key**: a figure's key is the canonical measurement key of its rows
  (``results.measurement_key``: path, workers, set, decoder, transform, cache state, batch
  size, ...; for a ratio, the pair of keys). One key quoted with two values fails;
- **one case per key**: a quoted key is measured by one case. Two studies that measure the
  same key are two numbers for one thing, however close, and fail: the studies must read
  one case twice instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd

from ..results import Results, Stat, key_label, keyed_throughput, latest_runs, ok_repeats

# Two quotes of one key agree when their values differ by less than this share: the same
# float, printed or recomputed, differs only in its last bits.
SAME_VALUE = 1e-9

Source = tuple[str, str, str]  # (study, case_id, metric)


@dataclass(frozen=True)
class Quote:
    """A figure a page shows: ``value`` (``unit``) read from ``sources``, or, with
    ``against``, the ratio of the figure from ``sources`` to the one from ``against``.
    ``place`` says where it is shown, ``what`` what it is."""

    place: str
    what: str
    value: float
    unit: str
    sources: tuple[Source, ...]
    against: tuple[Source, ...] = ()
    # A figure computed from its rows (over a machine limit, say) rather than their median:
    # sourced and keyed, but not recomputed.
    derived: bool = False

    @property
    def is_ratio(self) -> bool:
        return bool(self.against)


def rows_of(figure: Stat) -> tuple[Source, ...]:
    """The rows a figure was read from, or, derived, computed from."""
    return tuple(figure.sources or figure.derived_from)


def stat_quote(place: str, what: str, figure: Stat) -> Quote:
    return Quote(place, what, figure.median, figure.unit, rows_of(figure),
                 derived=not figure.sources)


def ratio_quote(place: str, what: str, ratio: float, top: Stat, other: Stat) -> Quote:
    return Quote(place, what, ratio, "ratio", rows_of(top), rows_of(other))


@dataclass(frozen=True)
class QuoteProblem:
    """A rule (``sourced``, ``one value per key``, ``one case per key``) a quote breaks."""

    rule: str
    text: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.text}"


@dataclass(frozen=True)
class QuoteReport:
    """How many quotes were checked, over how many keys, and what broke a rule."""

    checked: int
    keys: int
    problems: tuple[QuoteProblem, ...]

    @property
    def ok(self) -> bool:
        return self.checked > 0 and not self.problems


# -- collecting ---------------------------------------------------------------------------
GUIDE_PLACE = "docs/guide.md"
ANSWER_PLACE = "README answer table"
PEERS_PLACE = "README peers findings"
TARGETS_PLACE = "README targets table"


def guide_quotes(rows: Sequence) -> list[Quote]:
    """Each guide row's best and runner-up medians and their ratio, as the guide page (and
    ``advise``, which answers from these rows) shows them."""
    found = []
    for row in rows:
        found.append(stat_quote(GUIDE_PLACE, f"{row.question}: {row.best.label}",
                                row.best.stat))
        if row.runner_up is None:
            continue
        found.append(stat_quote(GUIDE_PLACE, f"{row.question}: {row.runner_up.label}",
                                row.runner_up.stat))
        found.append(ratio_quote(GUIDE_PLACE, f"{row.question}: {row.best.label} against "
                                 f"{row.runner_up.label}", row.ratio, row.best.stat,
                                 row.runner_up.stat))
    return found


def peers_quotes(results: Results, encodings: Iterable[str]) -> list[Quote]:
    """The in-RAM answer's recipe against the tuned DataLoader recipe (the answer table's
    "vs torch DataLoader" column) and storebench's best path against the best peer (the
    README's peers findings)."""
    from ..studies.peers.study import best_against_peers
    from .advise import recipe_versus_default

    found = []
    for encoding in encodings:
        versus = recipe_versus_default(results, encoding)
        answered = None if versus is None else (
            (versus[0].best.label, versus[0].best.stat), (versus[1].label, versus[1].stat),
            versus[2][0])
        peer = best_against_peers(results.df, encoding)
        against_peer = None if peer is None else (
            (peer[0][1], peer[0][3]), (peer[1][1], peer[1][3]), peer[2][0])
        for place, compared in ((ANSWER_PLACE, answered), (PEERS_PLACE, against_peer)):
            if compared is None:
                continue
            (label, value), (other_label, other), ratio = compared
            if label == other_label:
                continue
            found += [stat_quote(place, f"{encoding}: {label}", value),
                      stat_quote(place, f"{encoding}: {other_label}", other),
                      ratio_quote(place, f"{encoding}: {label} against {other_label}",
                                  ratio, value, other)]
    return found


def target_quotes(results: Results) -> list[Quote]:
    """Each performance target the results measure, as the targets table shows it."""
    from .targets import every_target

    found = []
    for _study, spec in every_target():
        measured = spec.measure(results)
        if measured is None:
            continue
        found.append(Quote(TARGETS_PLACE, spec.name, measured.value, "ratio",
                           tuple(measured.sources), tuple(measured.against),
                           derived=measured.derived))
    return found


def quotes(results: Results) -> list[Quote]:
    """Every quote the generated pages show, from ``results``."""
    from .guide import decision_guide

    encodings = [e for e in dict.fromkeys(results.df["encoding"].dropna()) if e]
    return [*guide_quotes(decision_guide(results)), *peers_quotes(results, encodings),
            *target_quotes(results)]


# -- checking -----------------------------------------------------------------------------
def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= SAME_VALUE * max(abs(a), abs(b), 1e-300)


def _source_text(sources: Sequence[Source]) -> str:
    return ", ".join(f"{study} {case_id} {metric}" for study, case_id, metric in sources)


class _Rows:
    """The rows quotes are checked against: ok timed repeats of each case's latest run,
    and the canonical key of every throughput case."""

    def __init__(self, df: pd.DataFrame) -> None:
        rows = ok_repeats(latest_runs(df))
        self.values = {source: part.sort_values("repeat")["value"].astype(float)
                       for source, part in rows.groupby(["study", "case_id", "metric"])}
        keyed = keyed_throughput(latest_runs(df))
        self.key_of: dict[Source, tuple] = {}
        self.cases_of: dict[tuple, set[Source]] = {}
        for source, part in keyed.groupby(["study", "case_id", "metric"]):
            for key in dict.fromkeys(part["key"]):
                self.key_of[source] = key
                self.cases_of.setdefault(key, set()).add(source)

    def key(self, sources: Sequence[Source]) -> tuple:
        """The figure's key: its rows' canonical keys where every one is a throughput;
        else the rows themselves (a size, a time: no other case can measure it)."""
        if sources and all(s in self.key_of for s in sources):
            return ("measured",
                    *sorted({self.key_of[s] for s in sources}, key=str),
                    *sorted({s[2] for s in sources}))
        return ("rows", *sorted(sources))


def check_quotes(results: Results | pd.DataFrame,
                 found: Sequence[Quote] | None = None) -> QuoteReport:
    """``found`` (default: ``quotes(results)``) held to the module's three rules."""
    df = results.df if isinstance(results, Results) else results
    if found is None:
        found = quotes(results) if isinstance(results, Results) else []
    rows = _Rows(df)
    problems: list[QuoteProblem] = []
    by_key: dict[tuple, list[Quote]] = {}
    for quote in found:
        if not quote.sources or (quote.is_ratio and not quote.against):
            problems.append(QuoteProblem("sourced", f"{quote.place}: {quote.what} "
                                         f"({quote.value:g} {quote.unit}) names no rows"))
            continue
        missing = [s for s in (*quote.sources, *quote.against) if s not in rows.values]
        if missing:
            problems.append(QuoteProblem("sourced", f"{quote.place}: {quote.what}: no ok "
                                         f"rows for {_source_text(missing)}"))
            continue
        if not quote.is_ratio:
            values = pd.concat([rows.values[s] for s in quote.sources])
            # A figure over several cases or metrics is derived from them, not their median.
            recomputable = len(quote.sources) == 1 and not quote.derived
            if recomputable and not _same(float(values.median()), quote.value):
                problems.append(QuoteProblem(
                    "sourced", f"{quote.place}: {quote.what} shows {quote.value:g} "
                    f"{quote.unit}, its rows give {float(values.median()):g} {quote.unit} "
                    f"({_source_text(quote.sources)})"))
            key = rows.key(quote.sources)
        else:
            key = ("ratio", rows.key(quote.sources), rows.key(quote.against))
        by_key.setdefault(key, []).append(quote)
    for quoted in by_key.values():
        values = [q.value for q in quoted]
        if any(not _same(values[0], v) for v in values[1:]):
            shown = "; ".join(f"{q.place}: {q.what} = {q.value:g} {q.unit}" for q in quoted)
            problems.append(QuoteProblem("one value per key", shown))
    seen: set[tuple] = set()
    for quote in found:
        for source in (*quote.sources, *quote.against):
            key = rows.key_of.get(source)
            if key is None or key in seen:
                continue
            seen.add(key)
            cases = sorted(rows.cases_of.get(key, ()))
            if len({(study, case_id) for study, case_id, _ in cases}) > 1:
                problems.append(QuoteProblem(
                    "one case per key", f"{key_label(key)} is quoted ({quote.place}: "
                    f"{quote.what}) and measured by {len(cases)} cases: "
                    f"{_source_text(cases)}"))
    return QuoteReport(len(found), len(by_key), tuple(problems))
