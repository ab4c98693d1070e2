"""Findings across studies: what the results cover, the machine they came from, every
study's sentences and the README's guide table, all from a results directory alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from result_rows import build_case, case_rows, feed_case, frame, read_case, write_results

from storebench.guide import guide_table
from storebench.report import findings
from storebench.report.guide import decision_guide
from storebench.results import TIE_RULE, Results
from storebench.studies import STUDIES, get_study

ENV = {"cpu_model": "Test CPU", "cpus_usable": 2, "ram_bytes": 24e9, "profile": "ci",
       "cuda": {"torch_cuda_available": False}, "utc_time": "2026-01-01T00:00:00+00:00"}
STUDIES_REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"
LIMITS = {"dram_read_GBps": 27.0, "page_cache_read_GBps": 14.0, "cold_seq_read_GBps": 2.1,
          "cold_random_4k_iops": 16_700.0}


def two_studies() -> list[list[dict]]:
    return [build_case("memmap", seconds=0.5, apparent=1_000_000, files=2),
            build_case("rawfiles", seconds=2.0, apparent=1_200_000, files=500),
            feed_case("process", 2, 2.0, [0.5, 0.52, 0.48, 0.51, 0.49]),
            feed_case("none", 0, 2.0, [0.2, 0.21, 0.19, 0.2, 0.2])]


def test_readme_findings_table_from_a_results_dir(tmp_path):
    write_results(tmp_path, *two_studies(), env=ENV)
    lines = findings.readme_findings_table(tmp_path).splitlines()
    assert lines[0] == ("Measured on: Test CPU, 2 cores; 24.0 GB RAM; no GPU; profile `ci`; "
                        "run 2026-01-01T00:00:00+00:00.")
    # One heading per study, its question, each over its own rows.
    assert lines[2:6] == ["## " + get_study("formats").question, "",
                          "| question | choice | evidence |", "|---|---|---|"]
    assert "## " + get_study("gpu_feed").question in lines
    assert ("| Fewest files, raw arrays (shared or object storage, many-file limits) | "
            "memmap-raw | memmap-raw 2 vs rawfiles-raw 500; 250\u00d7 smaller (exact); 2 "
            "candidates |") in lines
    # Allocated bytes per sample: the ci profile's raw samples are 3,072 pixel bytes each.
    assert ("| Least disk space per sample, allocated, lossless (raw or PNG samples) | "
            "memmap-raw | memmap-raw 3.07 kB vs rawfiles-raw 3.69 kB; 1.20\u00d7 smaller "
            "(exact); 2 candidates |") in lines
    (feed,) = [line for line in lines if line.startswith("| Keeping an accelerator busy")]
    assert feed.startswith("| Keeping an accelerator busy at 2 ms per batch (emulated "
                           "accelerator): which feed path? | ProcessPrefetcher \u00d72 | ")
    assert lines[-1] == f"Tie rule: {TIE_RULE}"
    # the table is the guide's, row for row
    rows = decision_guide(Results.load(tmp_path))
    assert sum(line.startswith("| ") for line in lines) == len(rows) + 2


def test_readme_findings_table_without_env_says_so(tmp_path):
    write_results(tmp_path, *two_studies())
    assert findings.readme_findings_table(tmp_path).splitlines()[0] == (
        "Machine unknown (no env.json).")


def test_readme_findings_table_needs_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results"):
        findings.readme_findings_table(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such results directory"):
        findings.readme_findings_table(tmp_path / "missing")


def test_guide_markdown_is_the_guide_table():
    rows = decision_guide(Results(frame(*two_studies()), {}))
    markdown = findings.guide_markdown(rows).splitlines()
    table = guide_table(rows)
    assert len(markdown) == len(table) + 2
    assert markdown[2].startswith(f"| {table['question'].iloc[0]} | {table['choice'].iloc[0]}")


def test_caveats_count_cases_and_failures():
    df = frame(read_case("memmap", "warm", [1.0, 1.0]),
               case_rows("formats", "read:hdf5-raw/warm", {"samples_per_s": [1.0]},
                         status="failed", format="hdf5", encoding="raw", cache="warm"))
    sentences = findings.caveats(Results(df, {}))
    assert sentences == [
        "2 cases in 1 studies, profile `ci`, from 1 run(s); 2 timed repeat(s) per case "
        "(figures are medians, ranges min to max).",
        "1 case(s) failed or timed out: read:hdf5-raw/warm (failed: RuntimeError: boom)."]


def test_caveats_state_the_machine_limits_ram_and_feed_device():
    df = frame(*two_studies())
    sentences = findings.caveats(Results(df, {**ENV, "limits": LIMITS}))
    assert sentences[0] == ("4 cases in 2 studies, profile `ci`, from 1 run(s); 1\u20135 "
                            "timed repeats per case (figures are medians, ranges min to max).")
    assert sentences[1] == "No case failed."
    assert sum(s.startswith("No CUDA device took part") for s in sentences) == 1
    assert ("The largest dataset measured is rawfiles-raw at 1.20 MB, <0.1% of this machine's "
            "24.0 GB RAM.") in sentences
    assert sentences[-1] == (
        "Machine limits measured in the same run: DRAM read 27.0 GB/s, page-cache read "
        "14.0 GB/s, cold sequential read 2.10 GB/s, cold 4 KiB random reads 16.7k IOPS.")


@pytest.mark.parametrize(("env", "line"), [
    (ENV, "Test CPU, 2 cores; 24.0 GB RAM; no GPU; profile `ci`; "
          "run 2026-01-01T00:00:00+00:00"),
    ({"cpu_count": 8, "storage": {"fs_type": "ext4", "device": "/dev/vda"},
      "cuda": {"torch_cuda_available": True, "devices": ["NVIDIA H100"]}},
     "unknown CPU, 8 cores; ext4 /dev/vda; NVIDIA H100"),
])
def test_machine_text(env, line):
    assert findings.machine_text(env) == line


def test_all_findings_are_keyed_by_study_in_run_order(tmp_path):
    write_results(tmp_path, *two_studies(), env=ENV)
    results = Results.load(tmp_path)
    every = findings.all_findings(results)
    assert list(every) == [name for name in STUDIES if name in {"formats", "gpu_feed"}]
    assert every["gpu_feed"] == STUDIES["gpu_feed"].findings(results)
    assert all(every.values())
    markdown = findings.findings_markdown(results, "gpu_feed").splitlines()
    assert markdown == [f"- {s}" for s in every["gpu_feed"]]
    with pytest.raises(KeyError, match="unknown study 'nope'"):
        findings.findings_markdown(results, "nope")


def test_a_notebook_opens_with_its_guide_choices_and_the_targets_it_meets(tmp_path):
    write_results(tmp_path, *two_studies(), env=ENV)
    results = Results.load(tmp_path)
    lines = findings.answer_lines(results, "formats")
    table = guide_table(STUDIES["formats"].guide(results))
    assert lines == [f"{q} \u2192 **{c}**" for q, c in zip(table["question"], table["choice"])]
    assert ("Fewest files, raw arrays (shared or object storage, many-file limits) \u2192 "
            "**memmap-raw**") in lines
    text = findings.answer_markdown(results, "formats")
    assert text.startswith(f"**{STUDIES['formats'].question}**\n\n- ")
    # gpu_feed declares no target of its own; its rows answer its guide questions.
    feed = findings.answer_lines(results, "gpu_feed")
    assert feed and all("\u2192 **" in line for line in feed)
    assert not [line for line in feed if line.startswith("Targets met")]


def test_a_long_guide_is_cut_and_says_how_many_questions_are_left(monkeypatch, tmp_path):
    write_results(tmp_path, *two_studies(), env=ENV)
    results = Results.load(tmp_path)
    every = findings.answer_lines(results, "formats")
    monkeypatch.setattr(findings, "ANSWER_QUESTIONS", 1)
    cut = findings.answer_lines(results, "formats")
    assert cut == [every[0], f"{len(every) - 1} more question(s) in the guide below."]


def test_a_study_without_rows_opens_with_its_findings_instead(tmp_path):
    write_results(tmp_path, *two_studies(), env=ENV)
    results = Results.load(tmp_path)
    assert findings.answer_lines(results, "resume") == \
        STUDIES["resume"].findings(results)[:3]


def test_the_targets_line_names_every_target_and_its_verdict():
    reference = Results.load(STUDIES_REFERENCE)
    line = findings.targets_line(reference, "peers")
    assert line.startswith("Targets met: ") and line.count(": ") >= 3
    assert "Ours vs the best peer, jpeg: " in line and "Ours vs the best peer, raw: " in line
    assert findings.targets_line(reference, "formats") == ""
