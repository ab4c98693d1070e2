"""Session fixtures: the ``ci`` profile built once in every format."""

from __future__ import annotations

import multiprocessing
import shutil
import tempfile
import time
from pathlib import Path

import pytest

import data_gen
from storebench.formats import FORMATS, build_dataset, unavailable_reason

# The ci study runs beside the other tests (``ci_study_run``), sharing the cores with them:
# its limit, from its start, allows for that.
CI_STUDY_TIMEOUT_S = 1500
# Test modules that compare the whole of /dev/shm before and after a case: they run first,
# before the ci study starts beside the others (its cases make segments there too).
BEFORE_CI_STUDY_MODULES = frozenset({"test_runner.py"})


# Session fixtures that run a whole product command (a study), and the test modules that
# run one themselves: their tests are the `slow` tier, left out of `make test-fast`.
PRODUCT_RUN_FIXTURES = frozenset({"ci_study"})
PRODUCT_RUN_MODULES = frozenset({"test_own_images_walkthrough.py", "test_notebooks.py"})
# The other tests that took at least SLOW_TEST_S (setup, call and teardown) in a whole run,
# one node id a line: `make test-durations` measures them again and rewrites the file.
SLOW_TESTS_FILE = Path(__file__).with_name("slow_tests.txt")
SLOW_TEST_S = 1.0


def pytest_addoption(parser) -> None:
    parser.addoption("--write-slow-tests", action="store_true",
                     help=f"rewrite {SLOW_TESTS_FILE.name} from this run's durations "
                          f"(tests that took at least {SLOW_TEST_S:g} s)")


def slow_tests() -> frozenset[str]:
    if not SLOW_TESTS_FILE.exists():
        return frozenset()
    lines = SLOW_TESTS_FILE.read_text().splitlines()
    return frozenset(line for line in lines if line and not line.startswith("#"))


def pytest_collection_modifyitems(items) -> None:
    """pytest-timeout counts a session fixture's setup against the first test that asks for
    it: a test that may start the ci study gets the study's own limit plus its own share.
    A test that runs a product command, through a fixture or itself, or that is listed in
    ``slow_tests.txt``, is marked ``slow``. The modules that read the ci study run last."""
    listed = slow_tests()
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "ci_study" in fixtures:
            item.add_marker(pytest.mark.timeout(CI_STUDY_TIMEOUT_S + 120))
        if (fixtures & PRODUCT_RUN_FIXTURES or item.path.name in PRODUCT_RUN_MODULES
                or item.nodeid in listed or item.nodeid.split("[")[0] in listed):
            item.add_marker(pytest.mark.slow)
    # The modules that read the ci study run last, each whole and in its order: the study,
    # started once the modules that must not run beside it are done (first), runs beside
    # every other module meanwhile.
    readers = {item.path for item in items if "ci_study" in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: 2 if item.path in readers
               else 0 if item.path.name in BEFORE_CI_STUDY_MODULES else 1)


class _Durations:
    """Each test's seconds over its phases, for ``--write-slow-tests``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.failed = False

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        self.failed |= report.failed

    def pytest_sessionfinish(self, session) -> None:
        options = session.config.option
        if self.failed or options.markexpr or options.keyword or options.file_or_dir:
            print(f"\n{SLOW_TESTS_FILE.name} left as it was: only a whole run that passed "
                  "rewrites it")
            return
        slow = sorted(node for node, seconds in self.seconds.items() if seconds >= SLOW_TEST_S)
        SLOW_TESTS_FILE.write_text(
            f"# Tests that took at least {SLOW_TEST_S:g} s in a run of the main environment's "
            "suite (make\n# test-durations rewrites it); a name without [parameters] lists "
            "each of its cases.\n# tests/conftest.py marks them slow, and make test-fast "
            "leaves them out.\n" + "".join(f"{node}\n" for node in slow))


def pytest_configure(config) -> None:
    if config.getoption("--write-slow-tests"):
        config.pluginmanager.register(_Durations(), "storebench-durations")


CHILD_EXIT_GRACE_S = 10.0


@pytest.fixture(scope="module", autouse=True)
def no_child_process_outlives_its_module():
    """A multiprocessing child a test module starts (its tests or its fixtures, such as a
    worker pool) must be gone when the module ends; a terminated child gets a moment to be
    reaped. A leak fails the module that made it, not a later test that counts children."""
    before = {child.pid for child in multiprocessing.active_children()}
    yield
    deadline = time.monotonic() + CHILD_EXIT_GRACE_S
    while True:
        left = [child for child in multiprocessing.active_children() if child.pid not in before]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for child in left:
        child.kill()
        child.join(5)
    assert not left, f"the module left child processes running: {left}"


@pytest.fixture(scope="session", autouse=True)
def trust_marks(tmp_path_factory):
    """The marks builds leave for trusted-input-only files (``storebench.formats.trust``)
    go to this session's own folder, not to the user's ~/.local/state."""
    from storebench.formats.trust import STATE_DIR_ENV

    patch = pytest.MonkeyPatch()
    patch.setenv(STATE_DIR_ENV, str(tmp_path_factory.mktemp("state")))
    yield
    patch.undo()


@pytest.fixture(scope="session")
def ci_profile() -> data_gen.Profile:
    return data_gen.PROFILES["ci"]


@pytest.fixture(scope="session")
def ci_data_root(tmp_path_factory, ci_profile) -> Path:
    """Every format x encoding of the ci profile, built once for the whole session (the
    peer formats where this interpreter has their library), and the peers study's cut sets
    in their own directory, as its ``prepare`` builds them."""
    # Not storebench.studies.peers: the studies import pandas and matplotlib, which the
    # processes these tests fork would then carry.
    from storebench.bench.plan import peer_sets_dir, peer_specs

    root = tmp_path_factory.mktemp("ci-data")
    for spec in ci_profile.specs:
        for name, module in FORMATS.items():
            if spec.encoding in module.ENCODINGS and unavailable_reason(name) is None:
                build_dataset(spec, name, root, workers=1)
    for spec in peer_specs(ci_profile.name):  # every format: those the study reads among them
        for name, module in FORMATS.items():
            if spec.encoding in module.ENCODINGS and unavailable_reason(name) is None:
                build_dataset(spec, name, peer_sets_dir(root), workers=1)
    return root


@pytest.fixture(scope="session")
def ci_dataset(ci_data_root):
    """Path of one built ci dataset: ``ci_dataset("hdf5", "jpeg")``."""

    def path(format_name: str, encoding: str) -> Path:
        return ci_data_root / f"{format_name}-{encoding}"

    return path


class CiStudyRun:
    """``storebench study --profile ci`` into ``root``, started at most once (``start``),
    detached (``detached_run``: not a descendant of this process, whose tests count their
    own children) and with a temporary directory of its own (tests compare what theirs
    holds)."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env, self.run = root, env, None
        self.temp = Path(tempfile.mkdtemp(prefix="sb-ci-"))  # short: socket paths under it

    def start(self):
        import sys

        from detached_run import DetachedRun

        from storebench.study import REPO_ROOT

        if self.run is None:
            self.run = DetachedRun(
                [str(Path(sys.executable).with_name("storebench")), "study", "--profile",
                 "ci", "--data", str(self.root / "data"), "--results",
                 str(self.root / "results"), "--quiet"],
                self.root / "run", env={**self.env, "TMPDIR": str(self.temp)}, cwd=REPO_ROOT)
        return self.run

    def close(self) -> None:
        if self.run is not None:
            self.run.stop()
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="session")
def ci_study_run(request, tmp_path_factory, trust_marks):
    """The session's ci study (``CiStudyRun``) where a selected test reads it (``ci_study``),
    else None; stopped at the session's end if still running."""
    import os

    if not any("ci_study" in getattr(item, "fixturenames", ())
               for item in request.session.items):
        yield None
        return
    study = CiStudyRun(tmp_path_factory.mktemp("ci-study"),
                       {**os.environ, "MPLBACKEND": "Agg"})
    try:
        yield study
    finally:
        study.close()


@pytest.fixture(autouse=True)
def ci_study_started_beside(request, ci_study_run) -> None:
    """Starts the ci study with the first test outside ``BEFORE_CI_STUDY_MODULES``, so that
    it runs beside the modules that do not read it (they run before those that do)."""
    if ci_study_run is not None and request.node.path.name not in BEFORE_CI_STUDY_MODULES:
        ci_study_run.start()


@pytest.fixture(scope="session")
def ci_study(ci_study_run) -> tuple[Path, object]:
    """``storebench study --profile ci`` run once, as ``make study`` runs it (build, every
    study, plots, notebooks), in a detached process started early in the session
    (``ci_study_run``): (the ci results directory, the completed process). The notebook and
    study-contract tests read what it wrote."""
    completed = ci_study_run.start().wait(CI_STUDY_TIMEOUT_S)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return ci_study_run.root / "results" / "ci", completed
