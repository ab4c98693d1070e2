"""The docs' "Your own images" page, as a new user runs it: its commands in order
(import, study on the ci plan, findings) on a folder of mixed JPEG/PNG images, then its
Python snippet."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from image_folder import make_image_folder

from storebench.studies import STUDIES

ROOT = Path(__file__).resolve().parents[2]
SECTION = (ROOT / "docs" / "own-images.md").read_text()
COMMANDS = [shlex.split(line, comments=True)
            for line in re.search(r"```bash\n(.*?)```", SECTION, flags=re.S).group(1).splitlines()
            if line.strip()]
SNIPPET = re.search(r"```python\n(.*?)```", SECTION, flags=re.S).group(1)
# The page's study runs the default (small) plan; the test runs the quick ci plan.
QUICK = ["--profile", "ci"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("walkthrough")
    make_image_folder(workdir / "my_images", per_class=12)
    return workdir


def storebench(workdir: Path, args: list[str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "storebench", *args], cwd=workdir,
                          capture_output=True, text=True, timeout=timeout)


def test_the_section_documents_import_study_findings():
    assert [c[:2] for c in COMMANDS] == [["storebench", "import"], ["storebench", "study"],
                                         ["storebench", "findings"]]


@pytest.mark.timeout(900)
def test_commands_in_order_end_with_this_machines_guide(workdir):
    imported = storebench(workdir, COMMANDS[0][1:] + ["--quiet"], 300)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert "built  data/my_images/memmap-raw  36 images, 3 classes" in imported.stdout

    study = storebench(workdir, COMMANDS[1][1:] + QUICK + ["--quiet"], 840)
    assert study.returncode == 0, study.stderr[-3000:]
    results = workdir / "results" / "my_images"
    timing = json.loads((results / "timing.json").read_text())
    assert timing["failed_cases"] == {}
    peers_reason = timing["skipped_studies"].pop("peers")
    assert peers_reason.endswith(
        "the peers study reads its sets in the peer libraries' formats, built from a "
        "profile's sets (storebench build --peer-sets); storebench import writes "
        "storebench's formats only")
    assert timing["skipped_studies"] == {
        name: "applies to the synthetic profiles only"
        for name, study in STUDIES.items() if study.synthetic_only}
    assert "targets" in timing["skipped_studies"]
    ran = {name for name, count in timing["ran_cases"].items() if count}
    assert ran == {name for name, study in STUDIES.items()
                   if not study.synthetic_only and name != "peers"}
    for name in ran:
        rows = pd.read_csv(results / f"{name}.csv")
        assert set(rows["profile"]) == {"my_images"}
        assert set(rows["status"]) == {"ok"}, name
        assert set(rows["encoding"]) <= {"raw", "mixed"}, name
    # The mixed-size encoded copy is decoded with "auto" and resized before batching.
    prefetch = pd.read_csv(results / "prefetch.csv")
    params = prefetch["params"].map(json.loads)
    encoded = params[prefetch["encoding"] == "mixed"]
    assert {p.get("resize") for p in encoded} == {"224x224"}
    assert {"auto", "pil", "tf"} <= {p.get("decode") for p in encoded}
    executed = sorted(p.name for p in (results / "notebooks").glob("*.ipynb"))
    assert executed == sorted(p.name for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    assert "Decision guide for this machine:" in study.stdout

    guide = storebench(workdir, COMMANDS[2][1:], 120)
    assert guide.returncode == 0, guide.stderr
    # each guide row names what it read: the import's images, and how they were resized
    assert re.search(r"workload: 36 imported images \(JPEG, PNG and others\) of many sizes, "
                     r"[\d,\u2013]+ KB stored per sample; read through a resize to 224x224",
                     guide.stdout), guide.stdout[:2000]
    assert "Tie rule:" in guide.stdout


@pytest.mark.timeout(300)
def test_python_snippet_runs(workdir):
    script = workdir / "snippet.py"
    body = "\n".join("    " + line for line in SNIPPET.splitlines())
    script.write_text(f"def main():\n{body}\n    print(images.shape, images.dtype, len(labels))"
                      f"\n\n\nif __name__ == '__main__':\n    main()\n")
    done = subprocess.run([sys.executable, str(script)], cwd=workdir, capture_output=True,
                          text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "('chat noir éè', 'golden retriever', '日本 犬') 36"
    assert lines[-1] == "(4, 224, 224, 3) uint8 4"  # 36 = 32 + a last batch of 4
