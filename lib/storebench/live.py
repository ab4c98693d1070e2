"""The live cells of the notebooks: one comparison timed on this machine in about a minute,
beside the committed reference's value for the same comparison.

A study declares its comparison (``Study.live``, a ``studies.base.LiveComparison``): two of
its own cases, picked from its grid by their fields. ``run_live`` builds the sets they read
where missing (once: later calls find them), lays the study's grid out over them, picks the
two cases, applies the cell's settings (workers, batch size, decoder, cache state), and runs
them with the study's own runner and cache control, each at least ``LIVE_REPEATS`` timed
repeats, into a directory of its own under ``<results root>/live/``. The ratio is the
repeat-paired ratio of medians and its bootstrap interval (``results.ratio_interval``);
the reference's is computed the same way from the reference's rows of the same comparison.
``run_recipes`` does the same for any two recipes (``storebench.recipes``), timed by one case
function over each recipe's pipeline. ``run_audit`` is the live cell of a study that audits
properties rather than timing rates (``studies.base.LiveAudit``): it runs the study's own
case for two recipes here, made smaller, and sets each property's verdict beside the
reference's; there is no ratio to take.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .bench.plan import plan_for
from .study import (
    LIVE_CELLS_ENV,
    REPO_ROOT,
    build_profile,
    data_dir_for,
    resolve_repo_path,
    study_data_dir,
    study_family,
)

REFERENCE_DIR = REPO_ROOT / "results" / "reference"
LIVE_DIR = "live"
# The fewest repeats a ratio's bootstrap interval is drawn from (``results.MIN_PAIRED_REPEATS``).
LIVE_REPEATS = 5
# On a compact plan (ci), which exercises the cell rather than measuring: too few for an
# interval either way, so the fewest that still show a spread.
COMPACT_LIVE_REPEATS = 2
# One case may take this long here before it is stopped: a live cell is meant to take a minute.
LIVE_CASE_TIMEOUT_S = 240.0
RECIPE_CASE = "storebench.studies.shared_cases:recipe_epoch_case"
RECIPES_STUDY = "recipes"
# The peers study's rows are each recipe's pipeline, measured as storebench measures it.
RECIPE_REFERENCE_STUDY = "peers"
RECIPE_METRIC = "samples_per_s"
RECIPE_REFERENCE_METRIC = "later_epochs_samples_per_s"


class LiveError(ValueError):
    """A live comparison that cannot be laid out here (an unknown choice, a case the grid
    does not hold)."""


@dataclass(frozen=True)
class LiveSide:
    """One side of a comparison on one machine: its name, the case and metric read, and
    its figure (None: not measured, ``why``)."""

    name: str
    case_id: str
    metric: str
    stat: object | None = None
    why: str = ""


@dataclass(frozen=True)
class LiveResult:
    """The comparison on this machine and on the reference machine: each a (ratio, low,
    high) or None, with its two sides; ``text`` is what the cell prints at its end."""

    title: str
    here: tuple[float, float, float] | None
    there: tuple[float, float, float] | None
    here_sides: tuple[LiveSide, LiveSide]
    there_sides: tuple[LiveSide, LiveSide]
    reference_machine: str
    seconds: float

    @property
    def text(self) -> str:
        return "\n".join([
            self.title,
            f"  your machine:      {_ratio_text(self.here, self.here_sides)}",
            f"  reference machine: {_ratio_text(self.there, self.there_sides)}"
            + (f" ({self.reference_machine})" if self.reference_machine else ""),
        ])

    def __str__(self) -> str:
        return self.text


def _ratio_text(ratio, sides) -> str:
    from .text import format_ratio, format_value

    missing = [side for side in sides if side.stat is None]
    if missing:
        return "not measured: " + "; ".join(f"{s.name}: {s.why}" for s in missing)
    value, low, high = ratio
    spread = (f"95% interval {format_ratio(low)}\u2013{format_ratio(high)}"
              if math.isfinite(low) and math.isfinite(high)
              else "no interval with so few repeats")
    a, b = sides
    return (f"{format_ratio(value)} ({spread}; {format_value(a.stat.median, a.stat.unit)} "
            f"vs {format_value(b.stat.median, b.stat.unit)}, n = {a.stat.count} and "
            f"{b.stat.count})")


def case_matches(case, fields: Mapping[str, object]) -> bool:
    """Whether ``case`` has every field of ``fields`` (``param_<name>``: a param, None for
    absent; ``function``: the case function's name)."""
    for key, wanted in fields.items():
        if key == "function":
            have = case.function.rpartition(":")[2].removesuffix("_case")
        elif key.startswith("param_"):
            have = case.param(key.removeprefix("param_"))
        else:
            have = getattr(case, key)
        if have != wanted:
            return False
    return True


def _setting_fields(settings: Mapping[str, object]) -> dict[str, object]:
    from .studies.base import LIVE_SETTINGS

    unknown = sorted(set(settings) - set(LIVE_SETTINGS))
    if unknown:
        raise LiveError(f"unknown live settings {unknown}; known: {list(LIVE_SETTINGS)}")
    return {LIVE_SETTINGS[name]: value for name, value in settings.items() if value is not None}


def with_settings(case, fields: Mapping[str, object]):
    """``case`` with each setting's field where the case has that field at all (a path of
    one thread keeps its zero workers, a raw set its lack of a decoder)."""
    changes: dict[str, object] = {}
    params = dict(case.params)
    for key, value in fields.items():
        if key.startswith("param_"):
            name = key.removeprefix("param_")
            if params.get(name) is not None:
                params[name] = value
        elif getattr(case, key) not in (None, "", 0):
            changes[key] = value
    return dataclasses.replace(case, params=params, **changes)


def pick_case(cases, choice: Mapping[str, object], fields: Mapping[str, object], *,
              what: str):
    """The grid's case that is ``choice`` and agrees with the most settings ``fields``,
    with the settings applied."""
    found = [case for case in cases if case_matches(case, choice)]
    if not found:
        raise LiveError(f"{what}: no case of the grid here has {dict(choice)}")
    best = max(found, key=lambda case: sum(case_matches(case, {k: v})
                                           for k, v in fields.items()))
    return with_settings(best, fields)


def _timed(case, *, repeats: int, samples: int | None):
    """``case`` sized for a live cell: fixed repeats, at most ``samples`` read per repeat."""
    epoch = case.epoch_samples
    if samples is not None and epoch is not None:
        epoch = min(epoch, samples)
    repeats = 1 if case.measured_once else repeats
    return dataclasses.replace(case, repeats=repeats, min_repeats=None, epoch_samples=epoch,
                               timeout_s=min(case.timeout_s or LIVE_CASE_TIMEOUT_S,
                                             LIVE_CASE_TIMEOUT_S))


def _pick(study, pair, fields, *, profile: str, data_dir: Path) -> list:
    """The pair's cases from the study's grid over ``data_dir``, settings applied."""
    grid = study.grid(profile=profile, data_dir=data_dir)
    return [pick_case(grid, study.live.choices[name], fields,
                      what=f"{study.name} live {name!r}") for name in pair]


def _build(study, comparison, pair, *, profile: str, data_dir: Path) -> None:
    """The sets the pair's cases read, where missing: the comparison's, and each choice's
    format and encoding."""
    formats = set(comparison.formats)
    encodings = set(comparison.encodings)
    for name in pair:
        choice = comparison.choices[name]
        formats |= {choice["format"]} if "format" in choice else set()
        encodings |= {choice["encoding"]} if "encoding" in choice else set()
    if study.reads_profile_sets:
        from .formats import FORMATS

        core = sorted(name for name in formats if name in FORMATS.core)
        if core:
            build_profile(profile, data_dir, formats=core, encodings=sorted(encodings),
                          knob_variants=False, progress=False,
                          family=study_family(study.name, profile))
    if study.prepare is not None:
        options = {"profile": profile, "data_dir": data_dir, "progress": False}
        if "formats" in inspect.signature(study.prepare).parameters:
            options["formats"] = tuple(sorted(formats))
        study.prepare(**options)


def _reference_side(reference, study: str, name: str, metric: str, where: Mapping,
                    case_id: str) -> LiveSide:
    """The reference's rows of the same comparison side: the case with the same id, else
    the one whose fields match ``where`` (a set of another size lays out other batch sizes
    and params), the first in id order."""
    from .results import MissingResultError, select, stat

    if reference is None:
        return LiveSide(name, "", metric, None, "no reference results")
    function = where.get("function")
    columns = {k: v for k, v in where.items() if k != "function" and k != "batch_size"}
    try:
        rows = select(reference.df, metric, study=study, **columns)
    except KeyError as err:
        return LiveSide(name, "", metric, None, str(err))
    if function is not None:
        rows = rows[rows["case_id"].str.startswith(f"{function}:")]
    ids = sorted(set(rows["case_id"]))
    if not ids:
        return LiveSide(name, "", metric, None, "the reference holds no rows of it")
    chosen = case_id if case_id in ids else min(ids, key=lambda i: (len(i), i))
    try:
        return LiveSide(name, chosen, metric, stat(reference.df, metric, study=study,
                                                   case_id=chosen))
    except MissingResultError as err:
        return LiveSide(name, chosen, metric, None, str(err))


def _here_side(results, study: str, name: str, case, metric: str) -> LiveSide:
    from .results import MissingResultError, failed_cases, stat

    try:
        return LiveSide(name, case.case_id, metric,
                        stat(results.df, metric, study=study, case_id=case.case_id))
    except MissingResultError:
        failed = failed_cases(results.df, study=study)
        failed = failed[failed["case_id"] == case.case_id]
        why = (f"{failed['status'].iloc[0]}: {failed['error'].iloc[0]}" if not failed.empty
               else f"no {metric} row")
        return LiveSide(name, case.case_id, metric, None, why)


def _ratio(sides: tuple[LiveSide, LiveSide], higher_is_better: bool):
    from .results import ratio_interval

    a, b = sides
    if a.stat is None or b.stat is None:
        return None
    return ratio_interval(a.stat, b.stat) if higher_is_better else ratio_interval(b.stat,
                                                                                  a.stat)


def _load_reference(reference_dir):
    from .results import Results

    try:
        return Results.load(resolve_repo_path(reference_dir))
    except FileNotFoundError:
        return None


def _run(cases, *, study: str, profile: str, results_dir: Path, services, log) -> object:
    """Run ``cases`` into ``<results_dir>/live/<study>-<time>-<pid>/<study>.csv``, a line
    per case: a directory of each run's own, so that two cells running at once (two
    notebooks, two kernels) never write or read each other's rows."""
    from .bench import runner
    from .results import Results

    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    live_dir = Path(results_dir) / LIVE_DIR / f"{study}-{stamp}-{os.getpid()}"
    live_dir.mkdir(parents=True, exist_ok=False)
    path = live_dir / f"{study}.csv"
    count = len(cases)

    def done(case, outcome):
        number = [c.case_id for c in cases].index(case.case_id) + 1
        log(f"  case {number}/{count} {outcome.status} in {outcome.seconds:.0f} s: "
            f"{case.case_id}")

    runner.run_cases(cases, path, profile=profile, resume=False, progress=False,
                     timeout_s=LIVE_CASE_TIMEOUT_S, on_case_done=done, services=services)
    return Results.load(live_dir)


def _quiet_progress_bars() -> None:
    """The build and the runner import tqdm.auto, which warns in a kernel without
    ipywidgets (naming its own path); a live cell draws no bar."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import tqdm.auto  # noqa: F401


def _machine(results, study: str) -> str:
    """The machine that wrote ``study``'s rows of ``results``."""
    from .text import machine_text

    env = results.study_env(study) if results is not None else {}
    return machine_text(env) if env else ""


def _live_cells_off(log: Callable[[str], None], what: str,
                    action: str = "time it") -> bool:
    """A study run executing its notebooks headless on a full plan turns live cells off
    (``study.LIVE_CELLS_ENV``): say so, and how to run the cell, instead of measuring.
    ``what``: what the notebook's rows above already did."""
    if os.environ.get(LIVE_CELLS_ENV) != "off":
        return False
    log(f"live: not run: a study run executed this notebook, and its rows above {what}. "
        f"Run this cell in Jupyter to {action} on your machine.")
    return True


def run_live(
    study,
    *,
    profile: str,
    data_root: Path | str = "data",
    results_dir: Path | str = "results",
    reference_dir: Path | str = REFERENCE_DIR,
    pair: tuple[str, str] | None = None,
    samples: int | None = None,
    repeats: int | None = None,
    log: Callable[[str], None] = print,
    **settings,
) -> LiveResult | None:
    """Time ``study``'s live comparison (``Study.live``; ``pair``: two of its choices,
    default its own) on this machine on ``profile``'s sets under ``data_root``, and set it
    beside the reference's. ``settings``: ``workers``, ``batch_size``, ``decoder``,
    ``cache`` (None: the study's own); ``samples``: the most samples a timed repeat reads
    (None: the study's own); ``repeats``: timed repeats of each case (None:
    ``LIVE_REPEATS``, fewer on a compact plan such as ci's); ``results_dir``: where
    ``live/`` goes. Prints a line as it starts, one per case, and the result
    (``LiveResult.text``) at the end. None, having said why, in a notebook a study run
    executes on a full plan (``study.LIVE_CELLS_ENV``)."""
    from .studies.base import LiveComparison

    comparison = study.live
    if not isinstance(comparison, LiveComparison):
        raise LiveError(f"study {study.name!r} declares no live comparison"
                        + (": its live cell runs an audit (run_audit)" if comparison else ""))
    pair = tuple(pair or comparison.pair)
    unknown = [name for name in pair if name not in comparison.choices]
    if len(pair) != 2 or unknown:
        raise LiveError(f"pair {pair}: two of {list(comparison.choices)}")
    fields = _setting_fields({**comparison.settings, **settings})
    if _live_cells_off(log, f"time the {study.name} study's comparisons"):
        return None
    _quiet_progress_bars()
    started = time.perf_counter()
    data_dir = study_data_dir(study.name, profile,
                              data_dir_for(profile, resolve_repo_path(data_root)))
    log(f"live: {study.name} study, {pair[0]} against {pair[1]}, on this machine "
        f"({profile} profile; building the sets it reads where missing)")
    try:
        picked = _pick(study, pair, fields, profile=profile, data_dir=data_dir)
    except (FileNotFoundError, LiveError):  # its sets are not all built yet
        picked = None
    if picked is None or any(case.dataset and not Path(case.dataset).exists()
                             for case in picked):
        _build(study, comparison, pair, profile=profile, data_dir=data_dir)
        picked = _pick(study, pair, fields, profile=profile, data_dir=data_dir)
    if repeats is None:
        repeats = COMPACT_LIVE_REPEATS if plan_for(profile).compact else LIVE_REPEATS
    timed = list({case.case_id: _timed(case, repeats=repeats, samples=samples)
                  for case in picked}.values())
    log(f"live: {len(timed)} case(s), {timed[0].repeats} timed repeats each")
    results = _run(timed, study=study.name, profile=profile,
                   results_dir=resolve_repo_path(results_dir), services=study.services,
                   log=log)
    here = tuple(_here_side(results, study.name, name, case, comparison.side_metric(i))
                 for i, (name, case) in enumerate(zip(pair, picked)))
    reference = _load_reference(reference_dir)
    there = []
    for i, (name, case) in enumerate(zip(pair, picked)):
        where = {**comparison.choices[name],
                 **{k: v for k, v in fields.items() if case_matches(case, {k: v})}}
        there.append(_reference_side(reference, study.name, name, comparison.side_metric(i),
                                     where, case.case_id))
    return _finish(f"{pair[0]} over {pair[1]}, {_metric_words(comparison)}",
                   here, tuple(there), comparison.higher_is_better, reference, study.name, started,
                   log)


def _metric_words(comparison) -> str:
    metric = comparison.side_metric(0).rpartition(".")[2]
    return (f"{metric} (higher is better)" if comparison.higher_is_better
            else f"{metric}: the second's over the first's (lower is better)")


def _finish(title, here, there, higher_is_better, reference, study, started,
            log) -> LiveResult:
    result = LiveResult(title, _ratio(here, higher_is_better), _ratio(there, higher_is_better),
                        here, there, _machine(reference, study), time.perf_counter() - started)
    log(f"live: done in {result.seconds:.0f} s")
    log(result.text)
    return result


def recipe_case(recipe, dataset: Path, manifest: Mapping, *, workers: int, batch_size: int,
                cache: str, repeats: int, samples: int | None):
    """The case timing ``recipe``'s pipeline over the set at ``dataset``: its batches of an
    epoch (at most ``samples``), in its own environment's interpreter."""
    from .bench.case import Case
    from .studies.grid import dataset_fields

    params = {"recipe": recipe.name}
    if recipe.environment != "main":
        params["environment"] = recipe.environment
    return Case(function=RECIPE_CASE, loader="lazy", prefetcher=recipe.loader,
                workers=workers, batch_size=batch_size, access="shuffle", cache=cache,
                repeats=repeats, epoch_samples=samples, timeout_s=LIVE_CASE_TIMEOUT_S,
                params=params, **{**dataset_fields(RECIPES_STUDY, dataset, manifest),
                                  "study": RECIPES_STUDY})


def run_recipes(
    pair: tuple[str, str],
    *,
    profile: str,
    data_root: Path | str = "data",
    results_dir: Path | str = "results",
    reference_dir: Path | str = REFERENCE_DIR,
    workers: int = 2,
    batch_size: int = 64,
    cache: str = "warm",
    samples: int | None = None,
    repeats: int | None = None,
    log: Callable[[str], None] = print,
) -> LiveResult | None:
    """Time two recipes (``storebench.recipes``) against each other on this machine, each
    over its own layout of ``profile``'s training set (built where missing; a peer
    library's layout needs the peers environment's build, ``make peers`` and the peers
    study), and set the ratio beside the reference's from the peers study's rows of the same
    pipelines."""
    import data_gen

    from .bench.plan import family_data_dir
    from .formats import FORMATS, dataset_dirname, read_manifest
    from .recipes import get_recipe
    from .studies.grid import batch_size_for

    recipes = [get_recipe(name) for name in pair]
    if _live_cells_off(log, "time the recipes"):
        return None
    if repeats is None:
        repeats = COMPACT_LIVE_REPEATS if plan_for(profile).compact else LIVE_REPEATS
    if len(recipes) != 2:
        raise LiveError(f"pair {pair}: two recipe names")
    _quiet_progress_bars()
    started = time.perf_counter()
    family = data_gen.get_profile(profile).study_family
    data_dir = family_data_dir(data_dir_for(profile, resolve_repo_path(data_root)), family)
    log(f"live: recipe {pair[0]} against {pair[1]} on this machine ({profile} profile; "
        "building the sets they read where missing)")
    cases = []
    for recipe in recipes:
        where = data_dir / dataset_dirname(recipe.layout, recipe.encoding)
        if not where.is_dir():
            if recipe.layout not in FORMATS.core:
                raise LiveError(f"recipe {recipe.name}: its layout {recipe.layout} is a peer "
                                f"format, built in the peers environment: run the peers "
                                f"study once (storebench run --study peers --profile "
                                f"{profile}) or pick a recipe over a core format")
            build_profile(profile, data_dir, formats=[recipe.layout],
                          encodings=[recipe.encoding], knob_variants=False, progress=False,
                          family=family)
        manifest = read_manifest(where)
        epoch = plan_for(profile).epoch_samples
        cap = samples if samples is not None else epoch
        cases.append(recipe_case(recipe, where, manifest, workers=workers,
                                 batch_size=batch_size_for(manifest["num_samples"],
                                                           batch_size),
                                 cache=cache, repeats=repeats, samples=cap))
    results = _run(cases, study=RECIPES_STUDY, profile=profile,
                   results_dir=resolve_repo_path(results_dir), services=None, log=log)
    here = tuple(_here_side(results, RECIPES_STUDY, name, case, RECIPE_METRIC)
                 for name, case in zip(pair, cases))
    reference = _load_reference(reference_dir)
    there = tuple(_reference_side(
        reference, RECIPE_REFERENCE_STUDY, recipe.name, RECIPE_REFERENCE_METRIC,
        {"prefetcher": recipe.loader, "format": recipe.layout, "encoding": recipe.encoding,
         "cache": cache,
         "param_crop_filter": "plain" if recipe.transform.filter == "plain" else None},
        "") for recipe in recipes)
    return _finish(f"recipe {pair[0]} over {pair[1]}, samples/s (higher is better)",
                   here, there, True, reference, RECIPE_REFERENCE_STUDY, started, log)



@dataclass(frozen=True)
class AuditResult:
    """A live audit's verdicts: per recipe, property -> verdict on this machine and on the
    reference machine (empty where it has none, ``why``); ``text`` is what the cell prints
    at its end."""

    title: str
    properties: tuple[str, ...]
    here: Mapping[str, Mapping[str, str]]
    there: Mapping[str, Mapping[str, str]]
    why_not_there: str
    reference_machine: str
    seconds: float

    @property
    def text(self) -> str:
        lines = [self.title]
        for recipe, verdicts in self.here.items():
            there = self.there.get(recipe)
            lines += [f"  {recipe}",
                      f"    your machine:      {self._verdicts_text(verdicts)}",
                      "    reference machine: "
                      + (self._verdicts_text(there) if there else
                         f"not measured: {self.why_not_there or 'no row of this recipe'}")]
        if self.reference_machine:
            lines.append(f"  reference run: {self.reference_machine}")
        return "\n".join(lines)

    def _verdicts_text(self, verdicts: Mapping[str, str]) -> str:
        return "; ".join(f"{name}: {verdicts.get(name, 'not run')}" for name in self.properties)

    def __str__(self) -> str:
        return self.text


def _audit_params(settings: Mapping[str, object]) -> dict[str, object]:
    """The case params a live audit's settings set: a count as it is, counts as a
    comma-separated list ("" for none)."""
    from .studies.base import LIVE_AUDIT_SETTINGS

    return {LIVE_AUDIT_SETTINGS[name]: (",".join(str(n) for n in value)
                                        if isinstance(value, (tuple, list)) else value)
            for name, value in settings.items() if value is not None}


def _verdict_rows(audit, results, names) -> dict[str, dict[str, str]]:
    """Recipe -> property -> verdict, of ``names``' rows in ``results``."""
    table = audit.verdicts(results)
    return {str(row["recipe"]): {name: str(row[name]) for name in audit.properties}
            for _, row in table.iterrows() if row["recipe"] in names}


def run_audit(
    study,
    *,
    profile: str,
    recipes: tuple[str, str] | None = None,
    samples: int | None = None,
    ranks: tuple[int, ...] | None = None,
    workers: tuple[int, ...] | None = None,
    data_root: Path | str = "data",
    results_dir: Path | str = "results",
    reference_dir: Path | str = REFERENCE_DIR,
    log: Callable[[str], None] = print,
) -> AuditResult | None:
    """Run ``study``'s live audit (``Study.live``, a ``studies.base.LiveAudit``) on this
    machine: its own case for each of ``recipes`` (default: the audit's pair), over a probe
    set of ``samples`` images (None: the audit's own, at most the profile's), with
    ``ranks`` (rank counts) and ``workers`` (worker counts) as the cell sets them (None: the
    audit's own), into ``<results_dir>/live/`` (``data_root``: as the other live cells';
    the audit builds its own probe sets); then print each recipe's verdicts beside
    the reference's for the same recipe and property. None, having said why, in a notebook
    a study run executes on a full plan (``study.LIVE_CELLS_ENV``)."""
    from .studies.base import LiveAudit

    audit = study.live
    if not isinstance(audit, LiveAudit):
        raise LiveError(f"study {study.name!r} declares no live audit")
    recipes = tuple(recipes or audit.recipes)
    if len(recipes) != 2:
        raise LiveError(f"recipes {recipes}: two recipe names")
    if _live_cells_off(log, "audit every recipe", "audit two of them"):
        return None
    _quiet_progress_bars()
    started = time.perf_counter()
    settings = {**audit.settings, **{name: value for name, value in
                                     (("samples", samples), ("ranks", ranks),
                                      ("workers", workers)) if value is not None}}
    params = _audit_params(settings)
    # The audit's cases build the probe sets they read: the grid reads no set of the data root.
    grid = study.grid(profile=profile,
                      data_dir=data_dir_for(profile, resolve_repo_path(data_root)))
    cases = []
    for name in recipes:
        case = pick_case(grid, {"param_recipe": name}, {}, what=f"{study.name} live audit")
        own = dict(case.params)
        wanted = {**own, **params}
        if "samples" in own and "samples" in params:
            # A smaller set than the profile's audits, never a larger one.
            wanted["samples"] = min(int(own["samples"]), int(params["samples"]))
        cases.append(dataclasses.replace(case, params=wanted, timeout_s=min(
            case.timeout_s or LIVE_CASE_TIMEOUT_S, LIVE_CASE_TIMEOUT_S)))
    shown = {key: cases[0].param(key) for key in params}
    log(f"live: {study.name} audit of {recipes[0]} and {recipes[1]} on this machine "
        f"({profile} profile; " + ", ".join(f"{k} {v or 'none'}" for k, v in shown.items())
        + ")")
    results = _run(cases, study=study.name, profile=profile,
                   results_dir=resolve_repo_path(results_dir), services=study.services,
                   log=log)
    here = _verdict_rows(audit, results, recipes)
    for name in recipes:
        here.setdefault(name, {prop: "not run" for prop in audit.properties})
    reference = _load_reference(reference_dir)
    there = _verdict_rows(audit, reference, recipes) if reference is not None else {}
    seconds = time.perf_counter() - started
    result = AuditResult(
        f"{study.name}: each property's verdict, {recipes[0]} and {recipes[1]} (audited here "
        f"in {seconds:.0f} s)",
        tuple(audit.properties), {name: here[name] for name in recipes}, there,
        "" if reference is not None else "no reference results",
        _machine(reference, study.name), seconds)
    log(f"live: done in {result.seconds:.0f} s")
    log(result.text)
    return result
