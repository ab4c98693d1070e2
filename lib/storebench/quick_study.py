"""``storebench study --quick``: the README's answer table measured on this machine in
minutes. It measures only the cases the committed reference's answer rests on, each
decision's two best candidates (``report.quick``), at the plan's decision repeats, on the
reference's own sets, then answers the table from those rows under the same rule."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path

import data_gen

from .study import (
    REPO_ROOT,
    StageLog,
    StudyTimes,
    build_profile,
    data_dir_for,
    duration_text,
    eta_text,
    record_environment,
    record_workloads,
    study_data_dir,
    study_family,
)

QUICK_DIR = "quick"
REPORT_FILE = "answer.md"
CASES_FILE = "quick_cases.json"


class QuickStudyError(ValueError):
    """The reference cannot seed a quick study (no answer rows, several profiles)."""


def reference_profile(reference) -> str:
    """The one profile the reference's rows ran (the quick study runs the same plan)."""
    profiles = sorted(set(reference.df["profile"].astype(str)))
    if len(profiles) != 1 or profiles[0] not in data_gen.PROFILES:
        raise QuickStudyError(f"{reference.directory}: rows of profile(s) {profiles}; a quick "
                              "study measures one synthetic profile's reference")
    return profiles[0]


def expected_seconds(reference, cases, decision_repeats: int) -> dict[tuple[str, str], float]:
    """Each case's expected seconds: its first pass in the reference, scaled to the repeats
    it takes here."""
    from .bench.eta import expected_case_seconds

    seen = expected_case_seconds(reference.directory, reference_profile(reference))
    df = reference.df
    out = {}
    for case in cases:
        key = (case.study, case.case_id)
        if key not in seen:
            continue
        rows = df[(df["study"] == case.study) & (df["case_id"] == case.case_id)
                  & (df["metric"] == case.metric) & (df["status"] == "ok")]
        first_pass = max(1, int((rows["run_id"] == rows["run_id"].iloc[0]).sum())) \
            if not rows.empty else 1
        out[key] = seen[key] * max(decision_repeats, first_pass) / first_pass
    return out


def _build(profile: str, data_dir: Path, cases, *, progress: bool) -> list:
    """Only the sets the cases read (and their knob variants where a case reads one), in
    the studies' own data directory; a study that prepares its own sets (``Study.prepare``:
    the peers study's cut copies, the remote study's streaming peers) prepares them, just
    the formats its cases read where it can say, and a study that reads no profile set
    (``Study.reads_profile_sets``) gets none built."""
    from .studies import get_study

    built = []
    by_dir: dict[Path, list] = {}
    for case in cases:
        study = get_study(case.study)
        if not study.reads_profile_sets:
            continue
        by_dir.setdefault(study_data_dir(case.study, profile, data_dir), []).append(case)
    for where, mine in by_dir.items():
        family = study_family(mine[0].study, profile)
        built += build_profile(
            profile, where, formats=sorted({c.format for c in mine}),
            encodings=sorted({c.encoding for c in mine}),
            knob_variants=any(c.dataset != f"{c.format}-{c.encoding}" for c in mine),
            progress=progress, family=family)
    for name in dict.fromkeys(c.study for c in cases):
        prepare = get_study(name).prepare
        if prepare is None:
            continue
        options = {"profile": profile, "data_dir": study_data_dir(name, profile, data_dir),
                   "progress": progress}
        if "formats" in inspect.signature(prepare).parameters:
            options["formats"] = tuple(sorted({c.format for c in cases if c.study == name}))
        prepare(**options)
    return built


def _decision_cases(planned: Sequence, wanted: set[str], profile: str, repeats: int) -> list:
    """The planned cases the quick study measures, each taken to at least ``repeats``
    timed repeats (a case measured once, a build's, keeps its one)."""
    from .studies.grid import repeat_fields

    fields = repeat_fields(profile, None, minimum=repeats)
    return [case if case.measured_once else dataclasses.replace(case, **fields)
            for case in planned if case.case_id in wanted]


def run_quick_study(
    *,
    reference_dir: Path | str = REPO_ROOT / "results" / "reference",
    data_root: Path | str = "data",
    results_root: Path | str = "results",
    resume: bool = True,
    drop_caches: bool = False,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    cases: Sequence | None = None,
) -> StudyTimes:
    """Measure the cases behind ``reference_dir``'s answer table into
    ``<results_root>/quick/`` and write the answer drawn from them (``answer.md``), the cases
    with the reference runs they came from (``quick_cases.json``) and ``timing.json``.
    An interrupted run resumes: the cases already in its results are not run again.
    ``cases`` (``report.quick.QuickCase``) replaces the reference's own selection."""
    from .bench import runner
    from .bench.eta import StudyEta
    from .bench.plan import case_timeout_s, plan_for
    from .bench.schema import finished_case_ids
    from .report.answer import answer_markdown
    from .report.quick import cases_json, quick_cases, quick_plan_text, quick_report
    from .results import Results
    from .studies import get_study

    reference = Results.load(reference_dir)
    profile = reference_profile(reference)
    cases = tuple(quick_cases(reference) if cases is None else cases)
    if not cases:
        raise QuickStudyError(f"{reference_dir}: its answer table rests on no measured case")
    repeats = plan_for(profile).decision_repeats or plan_for(profile).repeats
    data_dir = data_dir_for(profile, data_root)
    results_dir = Path(results_root) / QUICK_DIR
    results_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        for old in results_dir.glob("*.csv"):
            old.unlink()
    times = StudyTimes(QUICK_DIR, runner.new_run_id())
    stage = StageLog(times, results_dir)
    planned_ids: dict[str, list[str]] = {}
    for case in cases:
        planned_ids.setdefault(case.study, []).append(case.case_id)
    estimate = stage.estimate = StudyEta(planned_ids,
                                         expected_seconds(reference, cases, repeats))
    times.eta_seconds = estimate.seconds_left()
    stage.say(f"plan: {quick_plan_text(cases, reference)}; each at least {repeats} repeats; "
              f"stages: build, environment, "
              + ", ".join(f"study:{s}" for s in dict.fromkeys(c.study for c in cases))
              + f", report; {estimate.text()} after the build")
    (results_dir / CASES_FILE).write_text(cases_json(cases))

    stage("build", _build, profile, data_dir, cases, progress=progress,
          done_text=lambda built: f"{len(built)} set(s) built or found")
    stage("environment", record_environment, profile, data_dir, results_dir,
          run_id=times.run_id, drop_caches=drop_caches, label=profile)

    def case_done(case, outcome):
        estimate.done(case.study, case.case_id, outcome.seconds)

    for name in dict.fromkeys(c.study for c in cases):
        wanted = {c.case_id for c in cases if c.study == name}
        own_dir = study_data_dir(name, profile, data_dir)
        study = get_study(name)
        grid = study.grid(profile=profile, data_dir=own_dir)
        if study.finalists is not None:
            # A second stage's cases (whole-epochs finalists), laid out as the reference's
            # first stage's rows chose them.
            grid = [*grid, *study.finalists(reference, grid)]
        planned = _decision_cases(grid, wanted, profile, repeats)
        missing = sorted(wanted - {case.case_id for case in planned})
        if missing:
            # Its sets could not be built here (a peer environment missing, say): the answer
            # rows that rest on it say "not measured".
            times.skipped_studies[name] = (f"{len(missing)} case(s) not planned here: "
                                           + ", ".join(missing))
        results_path = results_dir / f"{name}.csv"
        done = finished_case_ids(results_path) if results_path.exists() else set()
        estimate.plan(name, [case.case_id for case in planned if case.case_id not in done])
        if not planned:
            continue
        record_workloads(results_dir, name, planned)
        run = stage(f"study:{name}", runner.run_cases, planned, results_path,
                    profile=profile, run_id=times.run_id, resume=True, drop_caches=drop_caches,
                    timeout_s=case_timeout_s(profile), progress=progress,
                    on_case_done=case_done, eta=estimate.text,
                    services=get_study(name).services, done_text=StageLog.cases_text)
        if run.failed:
            times.failed_cases[name] = list(run.failed)
        times.ran_cases[name] = len(run.ran)
        times.reused_cases[name] = len(run.skipped)

    def report() -> Path:
        quick = Results.load(results_dir)
        path = results_dir / REPORT_FILE
        path.write_text(quick_report(reference, quick, cases))
        return path

    stage("report", report)
    times.write(results_dir)
    quick = Results.load(results_dir)
    total = sum(times.stages.values())
    say = log or (lambda text: print(text, flush=True))
    say("\n".join([
        answer_markdown(quick, docs="docs/"),
        "",
        f"storebench study --quick: {duration_text(total)} in all; "
        + ", ".join(f"{n} {duration_text(s)}" for n, s in times.stages.items()) + ".",
        eta_text(times),
        f"The answer beside the reference's, and every case's median on both machines: "
        f"{results_dir / REPORT_FILE}; timing: {results_dir / 'timing.json'}.",
        *(f"  not measured, {name}: {why}" for name, why in times.skipped_studies.items()),
        *(f"  failed, {name}: {', '.join(ids)}" for name, ids in times.failed_cases.items()),
    ]))
    return times
