"""A case worker imports only what its case runs: the case functions every study names live
in modules that pull in neither pandas nor matplotlib (nor the studies' figures)."""

from __future__ import annotations

import subprocess
import sys

from storebench.studies import STUDIES

HEAVY = ("pandas", "matplotlib", "storebench.results")


def test_every_case_module_is_light(ci_data_root):
    modules = set()
    for study in STUDIES.values():
        for case in study.grid(profile="ci", data_dir=ci_data_root):
            modules.add(case.function.partition(":")[0])
            if case.summarise:
                modules.add(case.summarise.partition(":")[0])
    assert modules >= {"storebench.studies.prefetch.cases", "storebench.studies.targets.cases"}
    for module in sorted(modules):
        probe = (f"import sys, {module}; "
                 f"print(sorted(m for m in sys.modules if m in {HEAVY!r} "
                 "or m.startswith('storebench.studies.') and m.endswith('.study')))")
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[]", (module, done.stdout)


def test_reading_a_dataset_imports_neither_pandas_nor_matplotlib(ci_data_root):
    # A case reads through these readers in a fresh interpreter: an import they trigger on
    # the first read is start-up time and memory in every row of that format.
    probe = f"""
import sys
from pathlib import Path
from storebench.formats import find_datasets, open_dataset
top = Path({str(ci_data_root)!r})
for root in find_datasets(top):  # the peers study's cut sets in peers/ too
    reader = open_dataset(root)
    reader.read_many([3, 0, len(reader) - 1])
    reader.close()
    print(root.relative_to(top), sorted(m for m in {HEAVY[:2]!r} if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    read = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert {name.split("-")[0] for name in read} >= {
        "rawfiles", "hdf5", "lmdb", "memmap", "tfrecord", "parquet"}
    assert {name: heavy for name, heavy in read.items() if heavy != "[]"} == {}
