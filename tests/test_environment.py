"""environment.yml and pyproject.toml describe the same environment."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# What environment.yml names to make the environment, not as one of storebench's packages.
# What the C extensions build with (a compiler, libjpeg-turbo's headers), not pip packages.
TOOLS = ("python", "pip", "c-compiler", "libjpeg-turbo")


def name_of(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["dev"]
    return {name_of(r): r.replace(" ", "") for r in requirements}


def environment_requirements() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    found: dict[str, str] = {}
    for item in env["dependencies"]:
        if isinstance(item, dict):
            for requirement in item["pip"]:
                if not requirement.startswith("-e"):
                    found[name_of(requirement)] = requirement.replace(" ", "")
        elif name_of(item) not in TOOLS:
            found[name_of(item)] = item.replace(" ", "")
    return found


def test_same_packages_in_both():
    assert sorted(environment_requirements()) == sorted(pyproject_requirements())


def test_same_version_constraints_in_both():
    env, project = environment_requirements(), pyproject_requirements()
    assert {k: env[k] for k in project} == project
    assert project["torch"] == "torch==2.13.0"
    assert project["h5py"].endswith("<3.15")  # TensorFlow 2.21's cap


def test_conda_users_get_a_compiler_for_the_c_extensions():
    """pyproject builds storebench's extensions from C; conda has no system compiler or
    libjpeg headers to rely on. Only the one that links libjpeg is optional."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    modules = {m["name"]: m for m in setuptools["ext-modules"]}
    assert sorted(modules) == ["storebench._jpegwindow", "storebench._resize",
                               "storebench._rows"]
    assert [name for name, m in modules.items() if m.get("optional")] == [
        "storebench._jpegwindow"]
    assert modules["storebench._jpegwindow"]["libraries"] == ["jpeg"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "c-compiler" in env["dependencies"] and "libjpeg-turbo" in env["dependencies"]


def test_the_peers_environment_is_described_in_both():
    """environment.yml's comment block lists exactly pyproject's `peers` and `ffcv` extras
    (conda describes one environment per file; the peers one is built on top of it)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    text = (ROOT / "environment.yml").read_text()
    block = text[text.index("#   peers:"):]
    described = sorted(line.strip().removeprefix("#").strip().removeprefix("- ").strip()
                       for line in block.splitlines()[1:] if line.strip().startswith("#     -"))
    assert described == sorted(extras["peers"] + extras["ffcv"])
