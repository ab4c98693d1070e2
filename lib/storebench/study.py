"""The whole study: build a profile's datasets, run studies, record the machine, plot, and
execute the notebooks. ``storebench run`` and ``storebench study`` call these."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import data_gen

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
TIMING_FILE = "timing.json"


@dataclass
class StudyTimes:
    """Wall seconds of each stage of a full study, written to ``timing.json``."""

    profile: str
    run_id: str
    stages: dict[str, float] = field(default_factory=dict)
    failed_cases: dict[str, list[str]] = field(default_factory=dict)
    ran_cases: dict[str, int] = field(default_factory=dict)
    reused_cases: dict[str, int] = field(default_factory=dict)
    skipped_studies: dict[str, str] = field(default_factory=dict)
    # The studies' cases' estimated seconds when they were planned (NaN: no estimate).
    eta_seconds: float = math.nan

    def write(self, results_dir: Path) -> Path:
        path = results_dir / TIMING_FILE
        data = {
            "profile": self.profile,
            "run_id": self.run_id,
            "utc_time": datetime.now(UTC).isoformat(timespec="seconds"),
            "stage_seconds": self.stages,
            "total_seconds": sum(self.stages.values()),
            "failed_cases": self.failed_cases,
            "ran_cases": self.ran_cases,
            "reused_cases": self.reused_cases,
            "skipped_studies": self.skipped_studies,
            "eta_seconds": self.eta_seconds if math.isfinite(self.eta_seconds) else None,
        }
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path


def repo_relative(path: Path | str) -> str:
    """``path`` relative to the repository root when inside it (notebooks resolve such
    paths from the repository, whatever their working directory), else absolute."""
    path = Path(path).resolve()
    try:
        return path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def resolve_repo_path(path: Path | str) -> Path:
    """A notebook parameter back to a path: relative ones are from the repository root."""
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


def data_dir_for(profile: str, data_root: Path | str) -> Path:
    """The profile's folder under ``data_root``. A root that itself holds a dataset built
    from one of the profile's specs, and no folder for the profile, is the profile's own
    folder given as the root: refused, since studying it would build the whole profile
    again one level down."""
    root = Path(data_root)
    data_dir = root / profile
    if not data_dir.is_dir() and root.is_dir():
        held = _profile_dataset_in(root, profile)
        if held is not None:
            hint = f" ({root.parent} here)" if root.name == profile else ""
            raise ValueError(
                f"{root} holds the {profile} profile's datasets itself ({held}, ...), not a "
                f"folder per profile: --data is the root that holds {profile}/{hint}"
            )
    return data_dir


def _profile_dataset_in(root: Path, profile: str) -> str | None:
    """The name of the first folder right under ``root`` holding a dataset built from one
    of ``profile``'s specs, or None."""
    from data_gen import get_profile

    from .formats import DatasetError, read_manifest

    specs = [spec.to_dict() for spec in get_profile(profile).specs]
    for manifest in sorted(root.glob("*/manifest.json")):
        try:
            spec = read_manifest(manifest.parent)["spec"]
        except (DatasetError, OSError, KeyError):
            continue  # not a dataset this check can read: not the mistake it looks for
        if spec in specs:
            return manifest.parent.name
    return None


def results_dir_for(profile: str, results_root: Path | str) -> Path:
    return Path(results_root) / profile


def build_profile(
    profile: str,
    data_dir: Path | str,
    *,
    formats: Sequence[str] | None = None,
    encodings: Sequence[str] | None = None,
    knob_variants: bool = True,
    workers: int | None = None,
    progress: bool = True,
    force: bool = False,
    log: Callable[[str], None] | None = None,
    samples: int | None = None,
    family: str = "synthetic",
) -> list:
    """Build (or find already built) every core format x encoding of ``profile`` (or the
    formats named, peer formats included), and with ``knob_variants`` the formats study's
    variants (each format's ``TRAITS.knob_variants``) of its encodings. With ``samples``, each
    set is cut to its first ``samples`` samples where it has more: the same bytes as the
    whole set's, since a sample depends only on its spec's seed and its index. ``log``
    receives one line per dataset built, found or skipped. The peers study builds the peer
    formats itself, in the peers environment (``Study.prepare``). ``family`` chooses the
    profile's synthetic sets or its ImageNet-like ones (``data_gen.FAMILIES``); before
    anything is written, the whole build's estimated size is checked against the free disk."""
    from .formats import FORMATS, get_format, unavailable_reason
    from .formats.build import SampleCache

    chosen = data_gen.get_profile(profile)
    formats = list(formats or FORMATS.core)
    modules = {name: get_format(name) for name in formats}
    say = log or (lambda line: None)
    for name in list(formats):
        reason = unavailable_reason(name)
        if reason:
            say(f"skip   {name}: {reason}")
            formats.remove(name)
    specs = ([chosen.spec_for(e, family) for e in encodings] if encodings
             else list(chosen.family(family)))
    if samples is not None:
        if samples < 1:
            raise ValueError(f"samples must be positive, got {samples}")
        specs = [dataclasses.replace(spec, num_samples=min(samples, spec.num_samples))
                 for spec in specs]
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    check_build_space(specs, modules, data_dir, what=f"the {profile} profile's {family} sets")
    results = []
    # An ImageNet-like raw copy is made from its JPEG set's samples (``training_copies``):
    # a JPEG spec's sample cache stays open until the raw spec after it has used it.
    sources = {spec.source for spec in specs
               if spec.encoding == "raw" and hasattr(spec, "source")}
    specs = sorted(specs, key=lambda spec: spec not in sources)  # stable: sources first
    caches: dict = {}
    with contextlib.ExitStack() as keep:
        for spec in specs:
            source = (caches.get(getattr(spec, "source", None)) if spec.encoding == "raw"
                      else None)
            samples = None if source is None else (
                lambda spec=spec, source=source: data_gen.photo.training_copies(
                    spec, source, workers=workers))
            with contextlib.ExitStack() as own:
                cache = (keep if spec in sources else own).enter_context(
                    SampleCache(spec, data_dir, workers=workers, progress=progress,
                                samples=samples))
                caches[spec] = cache
                results += _build_spec(spec, chosen.spec_for(spec.encoding, family), cache,
                                       formats, modules, data_dir, knob_variants=knob_variants,
                                       family=family, workers=workers, progress=progress,
                                       force=force, say=say)
    return results


def _build_spec(spec, whole, cache, formats, modules, data_dir, *, knob_variants, family,
                workers, progress, force, say) -> list:
    """``build_profile``'s builds of one spec, every format and knob variant replayed from
    one generation of its samples, ``cache``."""
    from .formats import build_dataset
    from .formats import knob_variants as variants_of

    builds = [(name, {}, None) for name in formats if spec.encoding in modules[name].ENCODINGS]
    if spec != whole and not force:
        _refuse_to_replace_whole_sets(spec, whole, data_dir, [name for name, _, _ in builds])
    for name in formats:
        if spec.encoding not in modules[name].ENCODINGS:
            say(f"skip   {name}-{spec.encoding}: {name} stores {modules[name].ENCODINGS} only")
    if knob_variants:
        builds += [(v.format, dict(v.knobs), v.name)
                   for v in variants_of(formats, family=family)
                   if v.encoding == spec.encoding]
    results = []
    for name, knobs, dirname in builds:
        result = build_dataset(spec, name, data_dir, knobs=knobs, name=dirname, workers=workers,
                               progress=progress, source=cache, force=force)
        results.append(result)
        m = result.manifest
        say(f"{'exists' if result.skipped else 'built '} {result.path}  "
            f"{m['num_samples']} samples  {m['bytes_apparent'] / 1e6:.1f} MB apparent, "
            f"{m['bytes_allocated'] / 1e6:.1f} MB allocated, {m['file_count']} files, "
            f"written in {m['write_seconds']:.2f} s")
    return results


def build_families(profile: str, data_dir: Path | str, names: Sequence[str],
                   family: str | None = None, **options) -> list:
    """Build the sets of every dataset family studies ``names`` read (``study_family``),
    each in its own directory under ``data_dir``."""
    from .bench.plan import family_data_dir
    from .studies import get_study

    families = dict.fromkeys(study_family(name, profile, family) for name in names
                             if get_study(name).reads_profile_sets)
    return [result for chosen in families for result in build_profile(
        profile, family_data_dir(data_dir, chosen), family=chosen, **options)]


def check_build_space(specs: Sequence, modules: dict, data_dir: Path | str, *,
                      what: str) -> None:
    """Refuse (``DatasetError``) a build of ``specs`` in ``modules`` into ``data_dir`` that
    cannot fit on its disk: every format's copy not built there yet plus the sample cache,
    at once, before any sample is generated (a 30 GB build should not stop at 90%)."""
    from .formats import MANIFEST_NAME, dataset_dirname
    from .formats.build import check_free_space, estimate_bytes

    needed = 0
    for spec in specs:
        missing = [module for name, module in modules.items()
                   if spec.encoding in module.ENCODINGS and not (
                       Path(data_dir) / dataset_dirname(name, spec.encoding) / MANIFEST_NAME
                   ).is_file()]
        if missing:
            needed += estimate_bytes(spec) + sum(estimate_bytes(spec, m) for m in missing)
    check_free_space(Path(data_dir), needed, what)


def _refuse_to_replace_whole_sets(spec, whole, data_dir: Path | str,
                                  formats: Sequence[str]) -> None:
    """A build of ``spec``, cut from the profile's set ``whole``, must not silently replace a
    build of the whole set at the same place (a build of another spec is rebuilt there, as
    a set cut to another count is)."""
    from .formats import MANIFEST_NAME, dataset_dirname, read_manifest

    for name in formats:
        target = Path(data_dir) / dataset_dirname(name, spec.encoding)
        if not (target / MANIFEST_NAME).is_file():
            continue
        found = read_manifest(target)["spec"].get("num_samples")
        if found is not None and found == whole.num_samples != spec.num_samples:
            raise ValueError(
                f"{target}: holds a build of {found} samples; a build of its first "
                f"{spec.num_samples} would replace it: choose another --out, or pass --force")


def build_peer_sets(profile: str, data_dir: Path | str, *, formats: Sequence[str] | None = None,
                    family: str = "synthetic", **options) -> list:
    """Build the sets the peers study reads, in ``formats`` (default: every format): the
    profile's raw and JPEG sets of ``family`` cut to one count (``bench.plan.peer_specs``),
    in ``<data_dir>/peers``. ``options`` go to ``build_profile``."""
    from .bench.plan import peer_sets_dir, peer_specs

    raw, _ = peer_specs(profile, family)
    return build_profile(profile, peer_sets_dir(data_dir), formats=formats,
                         encodings=["raw", "jpeg"], samples=raw.num_samples, family=family,
                         **options)


def planned_cases(name: str, profile: str, data_dir: Path, repeats: int | None) -> list:
    """The study's grid for ``profile`` over the datasets in ``data_dir``."""
    from .studies import get_study

    kwargs = {"profile": profile, "data_dir": data_dir}
    if repeats is not None:
        kwargs["repeats"] = repeats
    return get_study(name).grid(**kwargs)


def study_family(name: str, profile: str, family: str | None = None) -> str:
    """The dataset family study ``name`` reads on ``profile``: the synthetic sets for a
    study whose questions are about them (``Study.synthetic_only``), else ``family`` or the
    profile's ``study_family``."""
    from .studies import get_study

    if get_study(name).synthetic_only:
        return "synthetic"
    if family is not None and family not in data_gen.FAMILIES:
        raise ValueError(f"unknown dataset family {family!r}; known: {list(data_gen.FAMILIES)}")
    return family or data_gen.get_profile(profile).study_family


def study_data_dir(name: str, profile: str, data_dir: Path, family: str | None = None) -> Path:
    """Where study ``name`` finds its datasets: its family's sets of ``data_dir``."""
    from .bench.plan import family_data_dir

    return family_data_dir(data_dir, study_family(name, profile, family))


def run_estimate(names, profile: str, data_dir: Path, repeats: int | None,
                 results_dir: Path, label: str, *, resume: bool = True,
                 family: str | None = None):
    """A ``bench.eta.StudyEta`` over the cases of ``names`` not yet in ``results_dir`` (all
    of them without ``resume``: each study's earlier rows are discarded before it runs),
    expecting each case to take what it took in the committed reference (same profile) or
    in this results directory's earlier rows."""
    from .bench.eta import StudyEta, expected_case_seconds
    from .bench.schema import finished_case_ids
    from .studies import get_study

    expected = expected_case_seconds(REPO_ROOT / "results" / "reference", label)
    expected.update(expected_case_seconds(results_dir, label))
    planned = {}
    for name in names:
        if get_study(name).synthetic_only and label != profile:
            continue
        path = results_dir / f"{name}.csv"
        done = finished_case_ids(path) if resume and path.exists() else set()
        try:
            own_dir = data_dir if label != profile else study_data_dir(name, profile, data_dir,
                                                                         family)
            ids = [c.case_id for c in planned_cases(name, profile, own_dir, repeats)]
        except FileNotFoundError:  # StudyNotApplicableError, or its family's directory
            # Its datasets are built when it starts (the peers study's sets, a family not
            # built yet): until then, the cases an earlier run of it measured; the study
            # replans when it starts.
            ids = [case_id for study, case_id in expected if study == name]
        planned[name] = [case_id for case_id in ids if case_id not in done]
    return StudyEta(planned, expected)


def imported_data_dir(dataset: Path | str) -> Path:
    """``dataset`` if it holds datasets written by ``storebench import``, else a clear error."""
    from .formats import find_datasets, read_manifest
    from .formats.specs import IMPORTED_KIND

    root = Path(dataset)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory (import images with "
                                "storebench import SRC --out DIR first)")
    if root.resolve().name in data_gen.PROFILES:
        # Results go to results/<name>/ and rows carry the name as their profile: a
        # synthetic profile's name would mix the two.
        raise ValueError(f"{root}: an imported dataset's directory cannot be named like a "
                         f"synthetic profile ({', '.join(sorted(data_gen.PROFILES))}); "
                         "rename it")
    if not any(read_manifest(p)["spec"].get("kind") == IMPORTED_KIND
               for p in find_datasets(root)):
        raise ValueError(f"{root}: holds no imported dataset; write one with "
                         f"storebench import SRC --out {root}")
    return root


def record_environment(
    profile: str, data_dir: Path, results_dir: Path, *, run_id: str, drop_caches: bool = False,
    label: str | None = None,
) -> dict:
    """Measure the machine's limits now and write ``env.json`` (an earlier run's env.json is
    kept as ``env-<run_id>.json`` beside it, since its rows stay in the results)."""
    from .bench.envinfo import collect_env, write_env
    from .bench.limits import limit_sizes_for, measure_limits

    results_dir.mkdir(parents=True, exist_ok=True)
    env_path = results_dir / "env.json"
    if env_path.exists():
        previous = json.loads(env_path.read_text())
        if previous.get("run_id") and previous["run_id"] != run_id:
            shutil.move(env_path, results_dir / f"env-{previous['run_id']}.json")
    limits = measure_limits(data_dir, sizes=limit_sizes_for(profile), drop_caches=drop_caches)
    env = collect_env(data_dir, profile=label or profile, limits=limits, repo_dir=REPO_ROOT)
    env["run_id"] = run_id
    if label is not None and label != profile:
        env["plan"] = profile
        env["dataset_dir"] = str(Path(data_dir).resolve())
    write_env(env_path, env)
    return env


def run_study(
    name: str,
    *,
    profile: str = data_gen.DEFAULT_PROFILE,
    data_root: Path | str = "data",
    results_root: Path | str = "results",
    repeats: int | None = None,
    resume: bool = True,
    drop_caches: bool = False,
    progress: bool = True,
    run_id: str | None = None,
    record_env: bool = True,
    dataset: Path | str | None = None,
    on_case_done=None,
    eta=None,
    on_planned=None,
    family: str | None = None,
):
    """Run one study into ``<results_root>/<profile>/<name>.csv``; builds what is missing.
    It reads the profile's sets of ``family`` (default: the profile's ``study_family``; the
    synthetic sets for a ``synthetic_only`` study).

    ``repeats=None`` and the per-case timeout come from the profile's ``bench.plan``. With
    ``resume`` (the default) cases already in the file are skipped, so an interrupted run
    picks up where it stopped; ``resume=False`` discards the earlier rows first.

    With ``dataset`` (a directory written by ``storebench import``) the study runs on those
    datasets instead, into ``<results_root>/<dataset name>/``, sized by ``profile``'s plan
    (``ci`` or ``small``); its rows name the dataset as their profile. ``on_case_done`` and
    ``eta`` are passed to ``bench.runner.run_cases`` (a full study's time estimate);
    ``on_planned(name, case_ids)`` is told the cases left to run once the grid is planned.
    """
    from .bench import runner
    from .bench.plan import case_timeout_s
    from .studies import get_study

    study = get_study(name)
    if dataset is not None:
        data_dir, label = imported_data_dir(dataset), Path(dataset).resolve().name
        if study.synthetic_only:
            raise ValueError(f"study {name!r} applies to the synthetic profiles only")
    else:
        label = profile
        data_dir = study_data_dir(name, profile, data_dir_for(profile, data_root), family)
        if study.reads_profile_sets:
            build_profile(profile, data_dir, progress=progress,
                          family=study_family(name, profile, family))
        if study.prepare is not None:
            study.prepare(profile=profile, data_dir=data_dir, progress=progress)
    results_dir = results_dir_for(label, results_root)
    results_dir.mkdir(parents=True, exist_ok=True)
    run_id = run_id or runner.new_run_id()
    if record_env:
        record_environment(profile, data_dir, results_dir, run_id=run_id, drop_caches=drop_caches,
                           label=label)
    cases = planned_cases(name, profile, data_dir, repeats)
    record_workloads(results_dir, name, cases)
    results_path = results_dir / f"{name}.csv"
    if not resume and results_path.exists():
        results_path.unlink()
    if on_planned is not None:
        from .bench.schema import finished_case_ids

        done = finished_case_ids(results_path)
        on_planned(name, [case.case_id for case in cases if case.case_id not in done])
    def run(stage_cases):
        return runner.run_cases(
            stage_cases,
            results_path,
            profile=label,
            run_id=run_id,
            resume=True,
            drop_caches=drop_caches,
            timeout_s=case_timeout_s(profile),
            progress=progress,
            on_case_done=on_case_done,
            eta=eta,
            services=study.services,
        )

    first = run(cases)
    if study.finalists is None:
        return first
    return run_finalists(study, first, cases, results_dir, run)


def run_finalists(study, first, cases, results_dir: Path, run):
    """A two-stage study's second stage (``Study.finalists``), laid out from the rows of its
    first (``first``, the run of ``cases``) and run by ``run(cases)`` into the same results;
    one summary of both stages."""
    from .results import Results

    finals = study.finalists(Results.load(results_dir), list(cases))
    if not finals:
        return first
    record_workloads(results_dir, study.name, [*cases, *finals])
    second = run(finals)
    return dataclasses.replace(
        first, ran=first.ran + second.ran, skipped=first.skipped + second.skipped,
        failed=first.failed + second.failed, seconds=first.seconds + second.seconds)


def record_workloads(results_dir: Path, name: str, cases) -> dict:
    """Write what study ``name``'s cases read, per encoding, into the results directory's
    workloads file (``results.WORKLOADS_FILE``; the guide rows name it), replacing that
    study's earlier entry."""
    from .results import WORKLOADS_FILE
    from .studies.grid import cases_workloads

    path = Path(results_dir) / WORKLOADS_FILE
    workloads = json.loads(path.read_text()) if path.exists() else {}
    workloads[name] = cases_workloads(cases)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(workloads, indent=2, sort_keys=True) + "\n")
    temporary.replace(path)
    return workloads


def execute_notebooks(
    results_dir: Path | str,
    *,
    profile: str,
    data_root: Path | str = "data",
    measure: bool = False,
    notebooks_dir: Path = NOTEBOOKS_DIR,
    progress: bool = True,
    jobs: int | None = None,
    live_cells: bool | None = None,
) -> list[Path]:
    """Execute every notebook with papermill into ``<results_dir>/notebooks/``, ``jobs`` at
    a time (default: one per core, at most two: each is a kernel that starts, imports and
    draws, mostly on one core). ``live_cells``: whether their live cells time their
    comparison (``LIVE_CELLS_ENV``); None: on a compact plan (ci) only.

    The notebooks read ``results_dir`` (and re-measure first only if ``measure``). Paths
    are passed relative to the repository when they lie inside it, so executed notebooks
    carry no temporary or machine-specific paths."""
    import concurrent.futures
    import multiprocessing

    from tqdm.auto import tqdm

    from .bench.plan import plan_for

    if live_cells is None:
        live_cells = plan_for(profile).compact
    live = "on" if live_cells else "off"
    results_dir = Path(results_dir).resolve()
    out_dir = results_dir / "notebooks"
    out_dir.mkdir(parents=True, exist_ok=True)
    parameters = {
        "profile": profile,
        "results_dir": repo_relative(results_dir),
        "data_root": repo_relative(Path(data_root).resolve()),
        "measure": measure,
    }
    notebooks = sorted(notebooks_dir.glob("[0-9]*.ipynb"))
    targets = [out_dir / notebook.name for notebook in notebooks]
    jobs = jobs or min(2, os.cpu_count() or 1)
    if measure or jobs == 1:
        # Measuring notebooks time things: one at a time, nothing beside them.
        for notebook, target in zip(notebooks, targets, strict=True):
            _execute_notebook(notebook, target, parameters, notebooks_dir, progress, live)
        return targets
    # Spawned: the pool's processes start clean, not as copies of a study's threads.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool, tqdm(
            total=len(notebooks), desc="notebooks", unit="notebook",
            disable=not progress) as bar:
        running = {
            pool.submit(_execute_notebook, notebook, target, parameters, notebooks_dir, False,
                        live): notebook.name
            for notebook, target in zip(notebooks, targets, strict=True)
        }
        for done in concurrent.futures.as_completed(running):
            try:
                done.result()
            except BaseException as err:
                for other in running:
                    other.cancel()
                err.add_note(f"while executing notebook {running[done]}")
                raise
            bar.set_postfix_str(running[done])
            bar.update(1)
    return targets


# Set to "off" in the kernels of notebooks a study run executes on a full (not compact)
# plan: their live cells then say how to run them rather than time their comparison again,
# which the study's own rows time (and which would add a minute a notebook to the study).
# On a compact plan (ci) the live cells run, so that every run of the tests exercises them.
LIVE_CELLS_ENV = "STOREBENCH_LIVE_CELLS"


def _execute_notebook(notebook: Path, target: Path, parameters: dict, cwd: Path,
                      progress: bool, live: str = "off") -> None:
    import papermill

    with live_cells_env(live):  # the kernel papermill starts inherits it
        papermill.execute_notebook(str(notebook), str(target), parameters=parameters,
                                   cwd=str(cwd), kernel_name="python3", progress_bar=progress)
    _relative_papermill_paths(target)


@contextlib.contextmanager
def live_cells_env(state: str):
    """``LIVE_CELLS_ENV`` set to ``state`` ("on" or "off") in this process while inside,
    for the kernels and processes started meanwhile; as it was afterwards."""
    before = os.environ.get(LIVE_CELLS_ENV)
    os.environ[LIVE_CELLS_ENV] = state
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LIVE_CELLS_ENV, None)
        else:
            os.environ[LIVE_CELLS_ENV] = before


def _relative_papermill_paths(path: Path) -> None:
    """papermill records where it read and wrote a notebook: keep those repo-relative, so an
    executed notebook names no machine's or temporary directory of the repository."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    recorded = notebook.metadata.get("papermill", {})
    for key in ("input_path", "output_path"):
        if recorded.get(key):
            recorded[key] = repo_relative(recorded[key])
    nbformat.write(notebook, path)


@dataclass
class StageLog:
    """Runs a full study's stages, timing each into ``times``, with a line as each starts
    and one as it ends (what it did and the time left, from ``estimate`` once there is
    one), whether or not progress bars are drawn: a log gets one line per stage."""

    times: StudyTimes
    results_dir: Path
    estimate: object | None = None

    @staticmethod
    def say(text: str) -> None:
        print(f"storebench study: {text}", file=sys.stderr, flush=True)

    @staticmethod
    def cases_text(run) -> str:
        """A finished study's cases (a ``bench.runner.StudyRun``)."""
        return f"{len(run.ran)} ran, {len(run.skipped)} reused, {len(run.failed)} failed"

    def __call__(self, name: str, fn, *args, done_text=None, **kwargs):
        """``fn(*args, **kwargs)`` as stage ``name``; ``done_text(result)`` says what it
        did."""
        started = time.perf_counter()
        self.say(name + (f" ({self.estimate.text()})" if self.estimate is not None else ""))
        try:
            result = fn(*args, **kwargs)
        finally:
            self.times.stages[name] = time.perf_counter() - started
            self.times.write(self.results_dir)
        detail = f": {done_text(result)}" if done_text is not None else ""
        left = f"; {self.estimate.text()}" if self.estimate is not None else ""
        self.say(f"{name} done in {duration_text(self.times.stages[name])}{detail}{left}")
        return result


def run_full_study(
    *,
    profile: str = data_gen.DEFAULT_PROFILE,
    data_root: Path | str = "data",
    results_root: Path | str = "results",
    repeats: int | None = None,
    resume: bool = True,
    drop_caches: bool = False,
    notebooks: bool = True,
    progress: bool = True,
    studies: tuple[str, ...] | None = None,
    log: Callable[[str], None] | None = None,
    dataset: Path | str | None = None,
    family: str | None = None,
) -> StudyTimes:
    """Build, run every study of ``STUDIES`` (or those named; one run id, one env.json),
    plot, execute the notebooks, then print a summary: where the results went, how many
    cases ran, were reused or failed, and this machine's decision guide.

    With ``dataset`` (a directory written by ``storebench import``) nothing is built: every
    study that applies to imported data runs on it, sized by ``profile``'s plan, into
    ``<results_root>/<dataset name>/``. A study that cannot run on it (synthetic only, or
    needing a raw copy that was not imported) is listed in ``timing.json`` with its reason.
    ``family`` chooses the profile's sets the training-set studies read (``study_family``).
    """
    from .bench import runner
    from .bench.plan import plan_for
    from .report.figures import plot_all
    from .studies import STUDIES, get_study
    from .studies.grid import StudyNotApplicableError

    names = list(studies) if studies is not None else list(STUDIES)
    for name in names:
        get_study(name)  # an unknown name fails before anything runs

    if dataset is not None:
        data_dir, label = imported_data_dir(dataset), Path(dataset).resolve().name
    else:
        data_dir, label = data_dir_for(profile, data_root), profile
    results_dir = results_dir_for(label, results_root)
    results_dir.mkdir(parents=True, exist_ok=True)
    times = StudyTimes(label, runner.new_run_id())

    stage = StageLog(times, results_dir)
    if dataset is None:
        stage("build", build_families, profile, data_dir, names, family, progress=progress)
    stage("environment", record_environment, profile, data_dir, results_dir,
          run_id=times.run_id, drop_caches=drop_caches, label=label)
    estimate = stage.estimate = run_estimate(names, profile, data_dir, repeats, results_dir,
                                             label, resume=resume, family=family)
    times.eta_seconds = estimate.seconds_left()

    def case_done(case, outcome):
        estimate.done(case.study, case.case_id, outcome.seconds)

    for name in names:
        if dataset is not None and get_study(name).synthetic_only:
            times.skipped_studies[name] = "applies to the synthetic profiles only"
            continue
        try:
            summary = stage(
                f"study:{name}", run_study, name, profile=profile, data_root=data_root,
                results_root=results_root, repeats=repeats, resume=resume,
                drop_caches=drop_caches, progress=progress, run_id=times.run_id,
                record_env=False, dataset=dataset, on_case_done=case_done, eta=estimate.text,
                on_planned=estimate.plan, done_text=StageLog.cases_text, family=family)
        except StudyNotApplicableError as err:
            if dataset is None:
                raise
            times.skipped_studies[name] = str(err)
            continue
        if summary.failed:
            times.failed_cases[name] = list(summary.failed)
        times.ran_cases[name] = len(summary.ran)
        times.reused_cases[name] = len(summary.skipped)
    ran = [name for name in names if name not in times.skipped_studies]
    budget_s = plan_for(profile).topup_budget_s
    if (budget_s > 0 or plan_for(profile).decision_repeats) and ran:
        stage("topup", top_up_results, results_dir, profile=profile,
              data_dir_of=lambda name: (data_dir if dataset is not None else
                                        study_data_dir(name, profile, data_dir, family)),
              budget_s=budget_s, studies=ran, drop_caches=drop_caches,
              done_text=topup_text)
    stage("plots", plot_all, results_dir)
    if notebooks:
        # Over a user's own images, the live cells (which time the profile's synthetic
        # sets) stay off: the rows above them are that dataset's measurement.
        stage("notebooks", execute_notebooks, results_dir, profile=profile,
              data_root=data_root, progress=progress,
              live_cells=False if dataset is not None else None)
    times.write(results_dir)
    os.sync()
    (log or (lambda text: print(text, flush=True)))(study_summary(results_dir, times))
    return times


def top_up_results(results_dir: Path, *, profile: str, data_dir_of, budget_s: float,
                   studies: Sequence[str] | None = None, drop_caches: bool = False):
    """``storebench.topup.top_up`` of ``results_dir`` under ``profile``'s case timeout and
    floor of decision repeats, one line per case it repeats (a log gets them too: a case
    takes seconds)."""
    from .bench.plan import case_timeout_s, plan_for
    from .topup import top_up

    return top_up(results_dir, profile=profile, data_dir_of=data_dir_of, budget_s=budget_s,
                  studies=studies, timeout_s=case_timeout_s(profile), drop_caches=drop_caches,
                  decision_repeats=plan_for(profile).decision_repeats,
                  log=lambda text: print(f"storebench topup: {text}", file=sys.stderr,
                                         flush=True))


def topup_text(record) -> str:
    """What a top-up did (a ``storebench.topup.TopupLog``), in a line."""
    entries = record.questions.values()
    decided = sum(1 for e in entries if e.get("after", {}).get("verdict") not in
                  ("undecided", None))
    per_case: dict = {}  # a case behind two questions is counted once
    for e in entries:
        for case_id, count in e["repeats_added"].items():
            key = (e["study"], case_id)
            per_case[key] = max(per_case.get(key, 0), count)
    added = sum(per_case.values())
    floor = (f"{len(record.floor)} top-two case(s) taken to {record.decision_repeats} "
             f"repeats; " if record.decision_repeats else "")
    return (f"{floor}{len(record.questions)} undecided question(s) topped up with {added} "
            f"repeats, {decided} now decided; {len(record.failed)} case(s) failed")


def top_up_timed(results_dir: Path, *, profile: str, data_root: Path | str = "data",
                 family: str | None = None, budget_s: float | None = None,
                 drop_caches: bool = False):
    """Top up a finished full study's results (``storebench topup``): the ``topup`` stage
    ``storebench study`` runs, added to its ``timing.json`` so that the study's time counts
    it."""
    from .bench.plan import plan_for

    results_dir = Path(results_dir)
    timing_path = results_dir / TIMING_FILE
    if not timing_path.exists():
        raise FileNotFoundError(f"{timing_path}: no such file; top up the results of a "
                                "finished storebench study")
    timing = json.loads(timing_path.read_text())
    times = StudyTimes(timing["profile"], timing["run_id"], dict(timing["stage_seconds"]),
                       timing["failed_cases"], timing["ran_cases"], timing["reused_cases"],
                       timing["skipped_studies"],
                       timing.get("eta_seconds") or math.nan)
    data_dir = data_dir_for(profile, data_root)
    studies = [name for name in times.ran_cases if name not in times.skipped_studies]
    stage = StageLog(times, results_dir)
    return stage("topup", top_up_results, results_dir, profile=profile,
                 data_dir_of=lambda name: study_data_dir(name, profile, data_dir, family),
                 budget_s=plan_for(profile).topup_budget_s if budget_s is None else budget_s,
                 studies=studies, drop_caches=drop_caches, done_text=topup_text)


def duration_text(seconds: float) -> str:
    """``"42 s"`` or ``"3.5 min"``."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def eta_text(times: StudyTimes) -> str:
    """How far the estimate made when the cases were planned was from the time the studies
    took; "" without an estimate."""
    took = sum(seconds for name, seconds in times.stages.items() if name.startswith("study:"))
    if not math.isfinite(times.eta_seconds) or took <= 0:
        return ""
    off = times.eta_seconds / took - 1
    return (f"The studies' cases took {duration_text(took)}; the estimate when they were "
            f"planned was {duration_text(times.eta_seconds)} ({off:+.0%}).")


def study_summary(results_dir: Path, times: StudyTimes) -> str:
    """What a finished study did, as text for the terminal or a log: where its results,
    figures and notebooks are, the time of each stage, every case that failed or was
    skipped with its reason, and this machine's guide."""
    from .guide import guide_text
    from .report.guide import decision_guide
    from .results import Results, failed_cases

    ran = sum(times.ran_cases.values())
    reused = sum(times.reused_cases.values())
    failed = sum(len(v) for v in times.failed_cases.values())
    lines = [f"storebench study: results in {results_dir}, figures in "
             f"{results_dir / 'figures'}, notebooks in {results_dir / 'notebooks'}, timing "
             f"in {results_dir / TIMING_FILE}"]
    if ran == 0 and reused:
        lines.append(f"All {reused} cases were reused from earlier runs: nothing was measured "
                     "again (use --fresh to re-measure).")
    else:
        lines.append(f"Cases: {ran} ran, {reused} reused from earlier runs, {failed} failed.")
    total = sum(times.stages.values())
    lines.append(f"Time: {duration_text(total)} in all; " + ", ".join(
        f"{name} {duration_text(seconds)}" for name, seconds in times.stages.items()) + ".")
    eta = eta_text(times)
    if eta:
        lines.append(eta)
    for study, reason in times.skipped_studies.items():
        lines.append(f"  skipped study {study}: {reason}")
    results = Results.load(results_dir)
    for row in failed_cases(results.df).itertuples():
        lines.append(f"  {row.status} {row.study} {row.case_id}: {row.error or 'no reason given'}")
    lines += ["", "Decision guide for this machine:", guide_text(decision_guide(results))]
    return "\n".join(lines)


# Set to any non-empty value, a notebook's ``measure = True`` never asks before measuring.
HEADLESS_ENV = "STOREBENCH_HEADLESS"


def asks_before_measuring() -> bool:
    """Whether someone can answer a question now: a Jupyter kernel asked by a front end
    that takes input (JupyterLab does; papermill and nbclient do not), or a terminal.
    Never with ``STOREBENCH_HEADLESS`` set."""
    if os.environ.get(HEADLESS_ENV):
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        shell = None
    else:
        shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is not None:
        return bool(getattr(kernel, "_allow_stdin", False))
    return sys.stdin is not None and sys.stdin.isatty()


def measure_plan_text(name: str, *, profile: str, data_root: Path | str,
                      results_root: Path | str) -> str:
    """What ``measure = True`` will do for study ``name``: its case count and estimated
    time, from the committed reference's case times (same profile) where it has them."""
    from .studies import get_study

    data_dir = data_dir_for(profile, resolve_repo_path(data_root))
    results_dir = results_dir_for(profile, resolve_repo_path(results_root))
    estimate = run_estimate([name], profile, data_dir, None, results_dir, profile)
    sets = ("its sets are built first where missing, then " if
            get_study(name).reads_profile_sets else "")
    return (f"measure = True runs the {name} study on this machine ({profile} profile): "
            f"{sets}{estimate.text()}; results go to {repo_relative(results_dir)}/, never "
            "over the reference.")


def measure_study(name: str, *, profile: str, data_root: Path | str, results_dir: Path | str,
                  ask: Callable[[str], str] = input, run: Callable | None = None,
                  interactive: bool | None = None) -> Path:
    """A notebook's ``measure = True``: print the study's plan (cases, estimated time)
    first, ask before starting when someone can answer (``asks_before_measuring``), never
    when run headless, then run it (``run_study``) into ``<results root>/<profile>`` and
    return that directory. Declined, nothing runs and ``results_dir`` is returned."""
    results_dir = resolve_repo_path(results_dir)
    print(measure_plan_text(name, profile=profile, data_root=data_root,
                            results_root=results_dir.parent), flush=True)
    if asks_before_measuring() if interactive is None else interactive:
        answer = ask("Start measuring? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("Not measured: the results below are those of "
                  f"{repo_relative(results_dir)}.")
            return results_dir
    (run or run_study)(name, profile=profile, data_root=resolve_repo_path(data_root),
                       results_root=results_dir.parent)
    return results_dir.parent / profile
