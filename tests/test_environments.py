"""The two environments: which interpreter a case or build gets, what is missing where, and
what a run records of the peers environment."""

from __future__ import annotations

import sys

import pytest

from storebench.environments import (
    EnvironmentUnavailableError,
    describe_peers,
    missing_modules,
    needs_text,
    python_for,
)


def test_the_main_environment_is_this_interpreter_and_unknown_ones_are_refused():
    assert str(python_for("")) == sys.executable == str(python_for("main"))
    with pytest.raises(KeyError, match="unknown environment 'gpu'; known: \\['main', 'peers'\\]"):
        python_for("gpu")


def test_a_missing_peers_environment_names_where_it_looked_and_how_to_make_it(
        monkeypatch, tmp_path):
    monkeypatch.setenv("STOREBENCH_PEERS_PYTHON", str(tmp_path / "python"))
    with pytest.raises(EnvironmentUnavailableError,
                       match=r"STOREBENCH_PEERS_PYTHON=.*/python does not exist.*make peers"):
        python_for("peers")
    assert describe_peers()["unavailable"].startswith("the peers environment is not installed")


def test_a_run_records_the_peers_environment_s_packages(monkeypatch):
    monkeypatch.setenv("STOREBENCH_PEERS_PYTHON", sys.executable)
    described = describe_peers()
    assert described["interpreter"] == sys.executable
    assert described["packages"]["numpy"] == __import__("numpy").__version__
    assert described["packages"]["ffcv"] is None  # not in the main environment
    assert "torchvision" in described["unavailable_here"]


def test_missing_modules_are_found_without_importing_them():
    assert missing_modules(["json", "no_such_module_here", "no_such.sub"]) == [
        "no_such_module_here", "no_such.sub"]
    assert needs_text(["json"], what="x") is None
    text = needs_text(["no_such_module_here"], what="format 'x'")
    assert text.startswith("format 'x' needs no_such_module_here, not installed in ")
    assert "make peers" in text
