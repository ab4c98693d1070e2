"""What a study run writes when its output goes to a file: plain lines, no progress-bar
frames, and a summary a person can act on."""

from __future__ import annotations

import subprocess
import sys

from storebench.bench.schema import ResultsWriter, make_row
from storebench.study import StudyTimes, study_summary


def test_without_a_terminal_no_progress_frames_are_written(ci_data_root):
    """``storebench verify`` draws a bar per dataset on a terminal; into a pipe (a log) it
    writes its one result line and no carriage returns."""
    dataset = ci_data_root / "lmdb-jpeg"
    result = subprocess.run([sys.executable, "-m", "storebench", "verify", str(dataset)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "\r" not in result.stdout + result.stderr
    assert result.stdout.startswith(f"OK   {dataset}  ")
    assert result.stderr == ""


def test_the_summary_gives_stage_times_failed_and_skipped_cases_with_reasons(tmp_path):
    rows = [
        make_row(run_id="r1", study="demo", case_id="fine", repeat=0, metric="samples_per_s",
                 value=10.0, unit="samples/s", status="ok", profile="small"),
        make_row(run_id="r1", study="demo", case_id="broken", repeat=-1, metric="case_seconds",
                 value=1.0, unit="s", status="failed", profile="small",
                 error="Traceback (most recent call last):\n  ...\nValueError: boom in x.h5"),
        make_row(run_id="r1", study="demo", case_id="absent", repeat=-1, metric="case_seconds",
                 value=0.0, unit="s", status="skipped", profile="small",
                 error="DALI is not installed in this environment"),
    ]
    with ResultsWriter(tmp_path / "demo.csv") as writer:
        writer.write_rows(rows)
    times = StudyTimes("small", "r1", stages={"build": 30.0, "study:demo": 150.0},
                       failed_cases={"demo": ["broken"]}, ran_cases={"demo": 3},
                       skipped_studies={"targets": "applies to the synthetic profiles only"})
    text = study_summary(tmp_path, times)
    lines = text.splitlines()
    assert lines[0] == (f"storebench study: results in {tmp_path}, figures in "
                        f"{tmp_path / 'figures'}, notebooks in {tmp_path / 'notebooks'}, "
                        f"timing in {tmp_path / 'timing.json'}")
    assert lines[1] == "Cases: 3 ran, 0 reused from earlier runs, 1 failed."
    assert lines[2] == "Time: 3.0 min in all; build 30 s, study:demo 2.5 min."
    assert not any(line.startswith("The studies' cases took") for line in lines)
    assert "  skipped study targets: applies to the synthetic profiles only" in lines
    assert "  failed demo broken: ValueError: boom in x.h5" in lines
    assert "  skipped demo absent: DALI is not installed in this environment" in lines
    assert "fine" not in text
    assert "\r" not in text


def test_each_stage_writes_one_line_as_it_starts_and_one_as_it_ends(tmp_path, capsys):
    from storebench.bench.eta import StudyEta
    from storebench.study import StageLog

    times = StudyTimes("ci", "r1")
    stage = StageLog(times, tmp_path)
    assert stage("plots", lambda x: x * 2, 21) == 42
    stage.estimate = StudyEta({"demo": ["a", "b"]}, {("demo", "a"): 5.0, ("demo", "b"): 5.0})
    stage("study:demo", lambda: "run", done_text=lambda result: f"did the {result}")
    assert capsys.readouterr().err.splitlines() == [
        "storebench study: plots",
        "storebench study: plots done in 0 s",
        "storebench study: study:demo (2 cases to run, about 10 s left)",
        "storebench study: study:demo done in 0 s: did the run; 2 cases to run, about 10 s "
        "left",
    ]
    assert set(times.stages) == {"plots", "study:demo"}
    assert (tmp_path / "timing.json").exists()


def test_the_summary_says_how_far_the_estimate_was_off():
    from storebench.study import eta_text

    times = StudyTimes("small", "r1", stages={"build": 30.0, "study:a": 100.0,
                                              "study:b": 50.0, "plots": 9.0},
                       eta_seconds=120.0)
    assert eta_text(times) == ("The studies' cases took 2.5 min; the estimate when they were "
                               "planned was 2.0 min (-20%).")
    assert eta_text(StudyTimes("small", "r1", stages={"study:a": 10.0})) == ""
