"""``storebench advise --measure``: the recipes advise's answer names, and its runner-up,
timed on this machine, and the answer given again with their rates in place of the
reference's.

Each recipe runs over the user's imported dataset (``--dataset``) or, without one, over the
first ``MEASURE_SAMPLES`` images of the reference profile's training set, built once under
``<data>/advise-measure/`` and found there later (the same bytes as the whole set's first
samples). The cases are the live cells' recipe cases (``live.recipe_case``) run by the
study runner with its cache control, from a warm cache: ``MEASURE_REPEATS`` repeats each,
an epoch of at most ``MEASURE_SAMPLES`` samples, into ``<results>/advise-measure/<time>/``.
A recipe's rate is taken after each epoch's first batch (the steady rate, the workers'
start left out), the median of its repeats.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from .report.advise import (
    AdviceError,
    MeasuredHere,
    RateHere,
    advise,
    recipes_to_measure,
    situation_from,
)

MEASURE_DIR = "advise-measure"
# The training set's images a recipe reads without --dataset, and its epoch's cap with one.
MEASURE_SAMPLES = 2000
MEASURE_REPEATS = 3
# Two recipes of at most this each, start-up included, keep a measurement within 10 minutes.
MEASURE_CASE_TIMEOUT_S = 240.0
# What a case's start costs beyond its epochs (a fresh interpreter, imports, the warm-up
# epoch's few batches), for the plan's estimate.
CASE_START_S = 5.0
RECIPE_BATCH_SIZE = 64


def _sets(targets, *, dataset: Path | None, profile: str, samples: int, data_root: Path
          ) -> tuple[dict[str, tuple[Path | None, str]], list]:
    """(recipe name -> (the set it reads, or None; why not), the recipes whose set is to be
    built): the user's imported layout, or the reference profile's training set cut to
    ``samples`` under ``<data_root>/advise-measure/``."""
    import data_gen

    from .formats import FORMATS, dataset_dirname

    found: dict[str, tuple[Path | None, str]] = {}
    to_build = []
    family = data_gen.get_profile(profile).study_family
    cut = data_root / MEASURE_DIR / f"{profile}-{family}-{samples}"
    for target in targets:
        recipe = target.recipe
        reason = recipe.unavailable()
        name = dataset_dirname(recipe.layout, recipe.encoding)
        if reason:
            found[recipe.name] = (None, reason.removeprefix(f"recipe {recipe.name}: "))
        elif dataset is not None:
            where = dataset / name
            found[recipe.name] = ((where, "") if where.is_dir() else (
                None, f"{where}: not in the import (storebench import SRC --out {dataset} "
                f"--formats {recipe.layout})"))
        elif recipe.layout not in FORMATS.core:
            found[recipe.name] = (None, f"its layout {recipe.layout} is a peer format, built "
                                        "in the peers environment only")
        else:
            found[recipe.name] = (cut / name, "")
            to_build.append(recipe)
    return found, to_build


def _build(to_build, *, profile: str, samples: int, where: Path,
           log: Callable[[str], None]) -> None:
    """The sets ``to_build`` read: the first ``samples`` of the profile's training set, in
    ``where`` (found there after the first time)."""
    import data_gen

    from .study import build_profile

    family = data_gen.get_profile(profile).study_family
    log(f"advise --measure: the first {samples:,} images of the {profile} profile's "
        f"{family} set in {where} (built once, found there later; not in the estimate)")
    build_profile(profile, where, formats=sorted({r.layout for r in to_build}),
                  encodings=sorted({r.encoding for r in to_build}), knob_variants=False,
                  progress=False, family=family, samples=samples)


def sample_bytes_of(manifest: dict) -> float:
    """The mean stored bytes of a sample of the set ``manifest`` describes: its spec's
    stored bytes where it records them (an import), else the build's over its samples."""
    stored = manifest["spec"].get("stored_bytes")
    total = stored if stored else manifest["bytes_apparent"]
    return float(total) / int(manifest["num_samples"])


def rate_after_first_batch(rows) -> tuple[float, int]:
    """(the median over repeats of samples after the first batch over the seconds after
    it, the repeats) from a recipe case's ok rows: its ``samples``, ``samples_per_s`` and
    ``time_to_first_batch_s``, and its batch size."""
    from .results import select

    rates = []
    by_metric = {m: select(rows, m).set_index("repeat")["value"]
                 for m in ("samples", "samples_per_s", "time_to_first_batch_s")}
    batch = float(rows["batch_size"].iloc[0])
    for repeat, samples in by_metric["samples"].items():
        seconds = samples / by_metric["samples_per_s"][repeat]
        after = seconds - by_metric["time_to_first_batch_s"][repeat]
        if samples > batch and after > 0:
            rates.append((samples - batch) / after)
    return (statistics.median(rates), len(rates)) if rates else (math.nan, 0)


def measure_advice(
    results_dir: Path | str,
    *,
    as_json: bool = False,
    samples: int = MEASURE_SAMPLES,
    repeats: int = MEASURE_REPEATS,
    data_root: Path | str = "data",
    results_root: Path | str = "results",
    log: Callable[[str], None] = print,
    **values,
) -> str:
    """``storebench advise --measure``'s output (module docstring): the plan with its
    estimate and a line per case go to ``log``; the answer with the rates measured here
    is returned, as text or JSON."""
    import json

    from .bench import runner
    from .bench.envinfo import collect_env, write_env
    from .formats import read_manifest
    from .live import recipe_case
    from .quick_study import reference_profile
    from .results import Results, failed_cases
    from .studies.grid import batch_size_for
    from .study import imported_data_dir
    from .text import format_value, machine_text

    if samples < 1 or repeats < 1:
        raise AdviceError(f"--measure-samples and repeats must be positive, got {samples} "
                          f"and {repeats}")
    dataset = values.get("dataset")
    if dataset is not None:
        dataset = imported_data_dir(dataset)
    situation = situation_from(**values)
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise AdviceError(f"{results_dir}: no such results directory")
    results = Results.load(results_dir)
    reference = advise(situation, results, dataset=dataset)
    targets = recipes_to_measure(reference, results)
    if not targets:
        raise AdviceError(f"--measure: the answer's loader path ({reference.loader.label}) "
                          "declares no recipe to time; storebench recipes lists them")
    profile = reference_profile(results)
    sets, to_build = _sets(targets, dataset=dataset, profile=profile, samples=samples,
                           data_root=Path(data_root))
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    out = Path(results_root) / MEASURE_DIR / f"{stamp}-{os.getpid()}"
    label = dataset.resolve().name if dataset is not None else profile
    runnable = [t for t in targets if sets[t.recipe.name][0] is not None]
    if not runnable:
        raise AdviceError("--measure: no recipe of the answer runs here: " + "; ".join(
            f"{t.recipe.name}: {sets[t.recipe.name][1]}" for t in targets))
    estimate = sum(CASE_START_S + (repeats + 1) * samples
                   / (t.reference if math.isfinite(t.reference) else 100.0)
                   for t in runnable)
    log(f"advise --measure: {len(runnable)} recipe(s) on this machine, {repeats} repeats of "
        f"at most {samples:,} samples each, in RAM, into {out}; about {estimate:.0f} s "
        "(from the reference's rates)")
    for target in targets:
        where, why = sets[target.recipe.name]
        log(f"  {target.role}: recipe {target.recipe.name}, {target.workers} worker(s), "
            + (f"over {where}" if where is not None else f"skipped: {why}"))
    if to_build:
        _build(to_build, profile=profile, samples=samples,
               where=sets[to_build[0].name][0].parent, log=log)
    cases = []
    for target in runnable:
        where = sets[target.recipe.name][0]
        manifest = read_manifest(where)
        cases.append(recipe_case(
            target.recipe, where, manifest, workers=target.workers,
            batch_size=batch_size_for(manifest["num_samples"], RECIPE_BATCH_SIZE),
            cache="warm", repeats=repeats, samples=min(samples, int(manifest["num_samples"]))))
    rows = None
    if cases:
        out.mkdir(parents=True, exist_ok=False)
        write_env(out / "env.json", collect_env(cases[0].dataset, profile=label))

        def done(case, outcome):
            number = [c.case_id for c in cases].index(case.case_id) + 1
            log(f"  case {number}/{len(cases)} {outcome.status} in {outcome.seconds:.0f} s: "
                f"recipe {case.param('recipe')}")

        runner.run_cases(cases, out / "recipes.csv", profile=label, resume=False,
                         progress=False, timeout_s=MEASURE_CASE_TIMEOUT_S, on_case_done=done)
        rows = Results.load(out)
    rates = []
    for target in targets:
        name = target.recipe.name
        where, why = sets[name]
        case = next((c for c in cases if c.param("recipe") == name), None)
        if case is None:
            rates.append(RateHere(target.role, name, target.reference, skipped=why))
            continue
        mine = rows.df[rows.df["case_id"] == case.case_id]
        median, count = rate_after_first_batch(mine)
        if not count:
            failed = failed_cases(mine)
            why = (f"{failed['status'].iloc[0]}: {failed['error'].iloc[0]}"
                   if not failed.empty else "no repeat read more than one batch")
            rates.append(RateHere(target.role, name, target.reference, skipped=why))
            continue
        # A path of fixed workers uses that many cores at most; one sizing its own, all.
        cores = min(float(target.workers or os.cpu_count() or 1),
                    float(len(os.sched_getaffinity(0))))
        rates.append(RateHere(target.role, name, target.reference, median, count,
                              max(cores, 1.0), sample_bytes_of(read_manifest(where)),
                              str(where)))
        log(f"  {name}: {format_value(median, 'samples/s')} here, the reference "
            f"{format_value(target.reference, 'samples/s')}")
    here = MeasuredHere(tuple(rates), machine_text(rows.env) if rows is not None else
                        "this machine", str(out))
    answer = advise(situation, results, dataset=dataset, here=here)
    return json.dumps(answer.to_dict(), indent=2) if as_json else answer.text()
