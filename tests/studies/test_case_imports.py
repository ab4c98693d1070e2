"""A case worker imports only what its case runs: the case functions every study names live
in modules that pull in neither pandas nor matplotlib (nor the studies' figures)."""

from __future__ import annotations

import subprocess
import sys

from storebench.studies import STUDIES

HEAVY = ("pandas", "matplotlib", "storebench.studies", "storebench.results")


def test_every_case_module_is_light(ci_data_root):
    modules = set()
    for study in STUDIES.values():
        for case in study.grid(profile="ci", data_dir=ci_data_root):
            modules.add(case.function.partition(":")[0])
            if case.summarise:
                modules.add(case.summarise.partition(":")[0])
    assert modules >= {"storebench.bench.cases", "storebench.cases.targets"}
    for module in sorted(modules):
        probe = (f"import sys, {module}; "
                 f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[]", (module, done.stdout)
