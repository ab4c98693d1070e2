"""The docs' reproducer scripts, one per failure the correctness study finds in a peer: each
still reproduces its failure with the peer library installed here (when a release fixes
one, this fails, and the docs and the study's reading must say so)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.peers
REPRODUCERS = Path(__file__).resolve().parents[2] / "docs" / "reproducers"


def reproduce(script: str, *args: str, library: str) -> subprocess.CompletedProcess:
    pytest.importorskip(library)
    return subprocess.run([sys.executable, str(REPRODUCERS / script), *args],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize(("script", "library"), [("webdataset_shuffle.py", "webdataset"),
                                                 ("litdata_shuffle.py", "litdata")])
def test_a_shuffle_reproducer_shows_an_order_close_to_the_stored_one(script, library):
    done = reproduce(script, "--seeds", "3", library=library)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[1:4]] == ["seed 0", "seed 1", "seed 2"]
    assert "not a shuffle" in done.stdout
    assert lines[-1].startswith("REPRODUCED: ") and lines[-1].endswith(
        " of 3 seeds' orders are not a shuffle")


def test_the_ffcv_reproducer_shows_a_seed_repeating_the_order_but_not_the_crops():
    done = reproduce("ffcv_unseeded_crops.py", "--samples", "64", "--workers", "1",
                     library="ffcv")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "order alike: 100%; crops alike: 0%" in done.stdout
    assert done.stdout.splitlines()[-1] == (
        "REPRODUCED: the seed repeats the order but not the crops")
