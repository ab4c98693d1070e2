"""Runs one case in this fresh interpreter: ``python -m storebench.bench.worker JOB.json``.

For each timed repeat the dataset is first put into the case's cache state and its resident
fraction measured, so every row records what the cache really held. The warm-up call (when the
case has one) is untimed and its metrics are discarded. A case's ``summarise`` function turns
the repeats' records into whole-case metrics (``repeat`` -1). The report goes to the job's
``result_path`` (written atomically); the current phase goes to ``phase_path`` so that the
parent can say where a crashed or timed-out case was.

The worker dies with its runner: it asks the kernel for SIGKILL when the runner ends
(``die_with_parent``), so a SIGKILLed runner cannot leave a case running. The runner also
starts ``python -m storebench.bench.watcher CASE_DIR`` beside each case (see
``storebench.bench.watcher``): it outlives a killed runner just long enough to kill what the
case started and remove the case's temporary directory.

Once its report is written the worker runs the exit handlers the libraries registered (their
clean-up: TensorFlow's generated files, multiprocessing's children) and ends (``exit_now``),
skipping the rest of the interpreter's teardown: the next case need not wait while torch or
TensorFlow is finalised.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

from ..processes import die_with_parent
from .cache import prepare, resident_fraction
from .case import Case, CaseResources, CaseSkipped, Trial
from .schema import CASE_REPEAT, METRIC_UNITS, UNITS
from .stats import (
    AdaptiveRepeats,
    forced,
    forced_repeat_rule,
    relative_halfwidth,
    stop_metric,
)


def resolve_function(path: str):
    module_name, _, name = path.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module {module_name!r} has no case function {name!r}") from None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _check_metrics(case: Case, metrics, harness: dict) -> dict:
    if not isinstance(metrics, dict):
        raise TypeError(
            f"case function {case.function} returned {type(metrics).__name__}, expected a dict "
            "of metric -> (value, unit)"
        )
    clash = set(metrics) & set(harness)
    if clash:
        raise ValueError(
            f"case function {case.function} returned {sorted(clash)}, which trial.measure() "
            "already provides"
        )
    checked = {}
    for name, pair in metrics.items():
        try:
            value, unit = pair
            value, unit = float(value), str(unit)
        except (TypeError, ValueError):
            raise TypeError(
                f"case function {case.function}: metric {name!r} must be (value, unit), got "
                f"{pair!r}"
            ) from None
        if not math.isfinite(value):
            raise ValueError(f"case function {case.function}: metric {name!r} is {value}")
        if unit not in UNITS or METRIC_UNITS.get(name, unit) != unit:
            expected = METRIC_UNITS.get(name, f"one of {UNITS}")
            raise ValueError(
                f"case function {case.function}: metric {name!r} has unit {unit!r}, "
                f"expected {expected}"
            )
        checked[name] = (value, unit)
    return {**harness, **checked}


def repeat_rule_metrics(case: Case, adaptive: AdaptiveRepeats | None
                        ) -> dict[str, tuple[float, str]]:
    """The rule the case's repeats ran under, as whole-case metrics: ``repeat_rule.minimum``
    and ``.maximum`` (both the count for fixed repeats), and for adaptive repeats the
    ``.halfwidth`` they stop at, the ``.budget_s`` and a target's ``.threshold`` where the
    rule has them (``adaptive``: the case's ``stats.AdaptiveRepeats`` as
    ``STOREBENCH_REPEAT_RULE`` forces it, ``stats.forced_repeat_rule``)."""
    if adaptive is None:
        return {"repeat_rule.minimum": (float(case.repeats), "count"),
                "repeat_rule.maximum": (float(case.repeats), "count")}
    rule = {"repeat_rule.minimum": (float(adaptive.minimum), "count"),
            "repeat_rule.maximum": (float(adaptive.maximum), "count"),
            "repeat_rule.halfwidth": (adaptive.halfwidth, "ratio")}
    if adaptive.budget_s is not None:
        rule["repeat_rule.budget_s"] = (adaptive.budget_s, "s")
    if adaptive.threshold is not None:
        rule["repeat_rule.threshold"] = (adaptive.threshold, "ratio")
    return rule


def run_job(job: dict) -> list[dict]:
    """The case's records: each repeat's metrics, then the whole-case rows (``repeat`` -1):
    the case's own summary, ``case_startup_s`` (from the runner starting this process to the
    case function being ready), ``repeats_run``, ``repeats_seconds`` (the timed repeats with
    their cache preparation: what a repeat budget counts) and ``median_ci_halfwidth`` (the
    relative half-width of the 95% bootstrap interval of the stop metric's median; what
    adaptive repeats stop on), ``epoch_samples_cap`` where the case caps its epochs, and the
    repeat rule itself (``repeat_rule_metrics``)."""
    case = Case.from_dict(job["case"])
    phase_path = Path(job["phase_path"])
    function = resolve_function(case.function)
    startup = time.time() - job["spawned_at"] if "spawned_at" in job else math.nan
    adaptive = forced(case.adaptive_repeats, forced_repeat_rule())
    records = []
    judged: list[float] = []

    # Services the case's trials share (``Trial.kept``), closed after its last trial.
    with CaseResources() as resources:

        def trial_for(repeat: int, label: str) -> Trial:
            _write_atomic(phase_path, f"{label} (preparing cache)")
            resident = math.nan
            if case.cache:
                resident = prepare(case.cache_files, case.cache,
                                   drop_caches=job["drop_caches"])
            _write_atomic(phase_path, label)
            return Trial(case, repeat, resident_fraction=resident, resources=resources)

        if case.warmup:
            # In whatever cache state the files are: nothing in it is measured, and each
            # timed repeat prepares its own (evicting 20,000 raw files first cost a third of
            # a second).
            _write_atomic(phase_path, "warm-up")
            function(case, Trial(case, CASE_REPEAT, resources=resources))
        most = f"up to {case.repeats}" if adaptive else f"{case.repeats}"
        repeats_began = time.perf_counter()  # the budget counts cache preparation too
        for repeat in range(case.repeats):
            trial = trial_for(repeat, f"repeat {repeat + 1} of {most}")
            metrics = _check_metrics(case, function(case, trial), trial.harness_metrics())
            if case.cache == "cold" and case.cache_files:
                # What the repeat left cached in this guest: with the residency it started
                # at, the evidence of what a cold repeat read from below the page cache.
                metrics["resident_fraction_after"] = (resident_fraction(case.cache_files),
                                                      "ratio")
            for name, (value, unit) in metrics.items():
                records.append({
                    "repeat": repeat,
                    "metric": name,
                    "value": value,
                    "unit": unit,
                    "resident_fraction": trial.resident_fraction,
                })
            judge = stop_metric(metrics)
            judged.append(metrics[judge][0] if judge else math.nan)
            elapsed = time.perf_counter() - repeats_began
            if adaptive is not None and (
                    adaptive.done(judged, elapsed_s=elapsed) if judge
                    else len(judged) >= adaptive.minimum):
                break
        repeats_seconds = time.perf_counter() - repeats_began
    summary = {}
    if case.summarise:
        _write_atomic(phase_path, "summary")
        summary = _check_metrics(case, resolve_function(case.summarise)(case, records), {})
    summary["repeats_run"] = (float(len(judged)), "count")
    summary["repeats_seconds"] = (repeats_seconds, "s")
    if all(math.isfinite(v) for v in judged):
        summary["median_ci_halfwidth"] = (relative_halfwidth(judged), "ratio")
    if math.isfinite(startup):
        summary["case_startup_s"] = (startup, "s")
    if case.epoch_samples is not None:
        summary["epoch_samples_cap"] = (float(case.epoch_samples), "count")
    summary.update(repeat_rule_metrics(case, adaptive))
    records += [
        {"repeat": CASE_REPEAT, "metric": name, "value": value, "unit": unit,
         "resident_fraction": math.nan}
        for name, (value, unit) in summary.items()
    ]
    return records


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m storebench.bench.worker JOB.json",
              file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    if "runner_pid" in job:
        die_with_parent(job["runner_pid"])
    result_path = Path(job["result_path"])
    try:
        records = run_job(job)
    except CaseSkipped as skipped:
        _write_atomic(result_path, json.dumps({"status": "skipped", "error": skipped.reason}))
        return 0
    except Exception:
        phase = Path(job["phase_path"])
        where = phase.read_text() if phase.exists() else "start-up"
        _write_atomic(result_path, json.dumps(
            {"status": "failed", "error": f"during {where}:\n{traceback.format_exc()}"}
        ))
        return 1
    # NaN residency (no cache control) is not JSON: send it as null.
    for record in records:
        if math.isnan(record["resident_fraction"]):
            record["resident_fraction"] = None
    _write_atomic(result_path, json.dumps({"status": "ok", "records": records}))
    return 0


def exit_now(code: int) -> None:
    """End this worker with ``code``: run the exit handlers (``atexit``: what libraries
    register to clean up after themselves, such as TensorFlow's generated files in the
    temporary directory and multiprocessing's children), then leave without the rest of the
    interpreter's teardown. The report is written by then, and finalising every module
    (torch's or TensorFlow's took most of a second, while the next case waited) changes
    nothing the runner reads. Whatever the case still left running or allocated is the
    runner's to clear: it kills the case's process group and removes the shared-memory
    segments the group left, as after a crash."""
    import atexit

    _flush()
    # No public call runs the handlers short of exiting; this is what Py_Finalize calls.
    atexit._run_exitfuncs()
    _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


if __name__ == "__main__":
    exit_now(main())
