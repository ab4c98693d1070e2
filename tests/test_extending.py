"""Adding a study is one folder, one registry line and one notebook; adding a format (its
knobs and remote reader included) is one module and one registry line. A toy study and a toy
format, defined in ``tests/extending/`` and registered there by ``sitecustomize.py`` (one line
each), run through the ci study, the format contract tests and the fuzzer with no other edit.
Every process of these tests that sees the toy registrations is a subprocess: this one's
registries stay as shipped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTENDING = Path(__file__).resolve().parent / "extending"


def with_toys() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(EXTENDING), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    return env


def run_python(code: str, *, timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=with_toys(),
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_one_registry_line_each_makes_them_a_core_format_and_the_last_study():
    done = run_python("""
        import json
        from storebench.formats import FORMATS, is_peer_format, knob_variants, traits
        from storebench.studies import STUDIES
        print(json.dumps([FORMATS.core[-1], is_peer_format("toy"), list(STUDIES)[-1],
                          [v.name for v in knob_variants(["toy"])],
                          traits("toy").remote_unsupported]))
    """, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [
        "toy", False, "toy", ["toy-raw-alignment=4096"],
        "the toy format is read from local disk only"]


def test_this_process_registries_are_untouched():
    from storebench.formats import FORMATS
    from storebench.studies import STUDIES

    assert "toy" not in FORMATS and "toy" not in STUDIES


def test_the_toy_study_and_format_run_through_the_ci_study(ci_study, tmp_path):
    # The shipped formats' rows come from the session's ci study: resumed, the formats
    # study measures only the cases the toy registration adds.
    shipped = ci_study[0] / "formats.csv"
    (tmp_path / "results" / "ci").mkdir(parents=True)
    shutil.copy(shipped, tmp_path / "results" / "ci" / "formats.csv")
    done = run_python(f"""
        from storebench.study import run_full_study
        run_full_study(profile="ci", data_root={str(tmp_path / "data")!r},
                       results_root={str(tmp_path / "results")!r}, studies=("formats", "toy"),
                       notebooks=False, progress=False, log=print)
    """, timeout=880)
    assert done.returncode == 0, done.stderr[-3000:]
    results = tmp_path / "results" / "ci"
    formats = pd.read_csv(results / "formats.csv")
    toy_rows = formats[formats["format"] == "toy"]
    assert set(toy_rows["status"]) == {"ok"}
    measured = set(toy_rows["case_id"].str.partition(":")[0])
    assert measured == {"build_cost", "sequential_read", "random_read"}
    # The knob variant the format declares was built and read beside the default build.
    assert toy_rows["params"].str.contains('"knob_alignment": 4096').any()
    toy = pd.read_csv(results / "toy.csv")
    assert set(toy["status"]) == {"ok"}
    assert "toy" in set(toy["format"]) and "memmap" in set(toy["format"])
    assert (results / "figures" / "toy_rates.png").stat().st_size > 0
    timing = json.loads((results / "timing.json").read_text())
    assert timing["failed_cases"] == {}
    assert "study:toy" in timing["stage_seconds"]
    shipped_ids = set(pd.read_csv(shipped)["case_id"])
    assert timing["reused_cases"]["formats"] == len(shipped_ids)
    assert timing["ran_cases"]["formats"] == len(set(toy_rows["case_id"]))
    assert not shipped_ids & set(toy_rows["case_id"])


@pytest.mark.timeout(900)
def test_the_format_contract_tests_cover_the_toy_format():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "toy",
         "tests/formats/test_contract.py", "tests/formats/test_corruption.py"],
        env=with_toys(), cwd=ROOT, capture_output=True, text=True, timeout=880)
    assert done.returncode == 0, done.stdout[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 10, summary


@pytest.mark.timeout(600)
def test_the_fuzzer_damages_and_checks_the_toy_format(tmp_path):
    data, out = tmp_path / "data", tmp_path / "fuzz.csv"
    done = run_python(f"""
        import data_gen
        from storebench.formats import build_dataset
        build_dataset(data_gen.PROFILES["ci"].spec_for("raw"), "toy", {str(data)!r},
                      workers=1)
    """, timeout=300)
    assert done.returncode == 0, done.stderr
    fuzz = subprocess.run(
        [sys.executable, "-m", "storebench", "fuzz", str(data), "--copies", "6", "--seed", "1",
         "--out", str(out), "--workers", "1", "--quiet"],
        env=with_toys(), cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert fuzz.returncode == 0, fuzz.stdout + fuzz.stderr
    from storebench.fuzz import COLUMNS

    rows = pd.read_csv(out)
    assert tuple(rows.columns) == COLUMNS
    assert set(rows["format"]) == {"toy"} and len(rows) == 12  # 6 copies x 2 verify modes
    assert "all 12 reads meet the bar" in fuzz.stdout
