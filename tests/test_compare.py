"""``storebench compare RUN_A RUN_B``: RUN_A's guide decisions, question by question, in
RUN_B: held, became a tie or undecided, or flipped to another winner."""

from __future__ import annotations

import subprocess
import sys

from result_rows import prefetch_case, read_case, write_results

from storebench.report.compare import compare_command

FIVE = (1.0, 1.01, 0.99, 1.005, 0.995)


def times(rate: float) -> list[float]:
    return [rate * f for f in FIVE]


def run(directory, *, memmap: float, rawfiles: float, thread: float, none: float,
        process: float | None, hdf5: float | None = None):
    """A formats question (cold reads), prefetch questions over memmap-raw, lmdb-raw (with
    ``process``) and hdf5-raw (with ``hdf5``)."""
    groups = [read_case("memmap", "cold", times(memmap)),
              read_case("rawfiles", "cold", times(rawfiles)),
              prefetch_case("thread", 2, times(thread)),
              prefetch_case("none", 0, times(none))]
    if process is not None:
        groups.append(prefetch_case("process", 2, times(process), fmt="lmdb"))
        groups.append(prefetch_case("none", 0, times(100.0), fmt="lmdb"))
    if hdf5 is not None:
        groups.append(prefetch_case("thread", 2, times(hdf5), fmt="hdf5"))
        groups.append(prefetch_case("none", 0, times(100.0), fmt="hdf5"))
    return write_results(directory, *groups)


def storebench(*args):
    return subprocess.run([sys.executable, "-m", "storebench.cli", *args],
                          capture_output=True, text=True, timeout=300)


def test_each_decision_is_held_tied_undecided_or_flipped(tmp_path):
    a = run(tmp_path / "a", memmap=800.0, rawfiles=100.0, thread=200.0, none=100.0,
            process=300.0, hdf5=150.0)
    b = run(tmp_path / "b", memmap=100.0, rawfiles=800.0, thread=201.0, none=200.0,
            process=None, hdf5=151.0)
    result = storebench("compare", str(a), str(b))
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[:3] == [f"RUN_A: {a}", f"RUN_B: {b}", ""]
    assert [cell.strip() for cell in lines[3].split(" | ")] == [
        "question", "RUN_A", "RUN_B", "outcome"]
    outcomes = [line.rsplit(" | ", 1)[1] for line in lines[5:-2]]
    # Cold reads flipped; memmap-raw became a tie; hdf5-raw held; lmdb-raw is not in RUN_B.
    assert sorted(outcomes) == sorted(["flipped to another winner", "became a tie",
                                       "same decision", "missing in RUN_B"])
    assert lines[-1] == "1 of 4 decisions of RUN_A hold in RUN_B (25%); 1 flipped to another winner"
    flipped = next(line for line in lines if line.endswith("flipped to another winner"))
    assert "| memmap " in flipped and "| rawfiles " in flipped
    tie = next(line for line in lines if line.endswith("became a tie"))
    assert "| equivalent: ThreadPrefetcher \u00d72, one thread, no prefetcher " in tie


def test_a_run_against_itself_holds_every_decision_and_lists_undecided_rows(tmp_path):
    a = run(tmp_path / "a", memmap=800.0, rawfiles=100.0, thread=200.0, none=100.0,
            process=300.0)
    # Three repeats cannot decide (fewer than 5 on a side): listed, not counted.
    write_results(tmp_path / "a", prefetch_case("thread", 2, [200.0, 201.0, 199.0],
                                                fmt="tfrecord"),
                  prefetch_case("none", 0, [100.0, 101.0, 99.0], fmt="tfrecord"))
    text = compare_command(a, a)
    assert text.splitlines()[-1] == ("3 of 3 decisions of RUN_A hold in RUN_B (100%); "
                                     "0 flipped to another winner")
    assert sum(line.endswith("| was undecided in RUN_A") for line in text.splitlines()) == 1


def test_a_question_whose_text_changed_is_matched_by_its_facets(tmp_path):
    from dataclasses import replace

    from storebench.report.compare import compare_guides
    from storebench.report.guide import decision_guide
    from storebench.results import Results

    a = run(tmp_path / "a", memmap=800.0, rawfiles=100.0, thread=200.0, none=100.0,
            process=300.0)
    rows = decision_guide(Results.load(a))
    cold = next(row for row in rows if row.study == "formats")
    assert cold.facets  # the fallback needs a row's situation as data
    renamed = [replace(row, question=row.question + " (reworded)") if row is cold else row
               for row in rows]
    by_text = {c.question: c for c in compare_guides(rows, renamed)}
    assert by_text[cold.question].outcome == "same decision"
    assert by_text[cold.question].decision_b == cold.best.label
    # Two rows of one situation are ambiguous: no match rather than a guess.
    twin = replace(cold, question="another wording")
    both = [twin if row is cold else row for row in rows] + [replace(twin, question="a third")]
    assert {c.question: c for c in compare_guides(rows, both)}[cold.question].outcome == (
        "missing in RUN_B")
