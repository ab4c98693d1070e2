"""env.json: documented keys, the data directory's real filesystem, git state, no heavy imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from storebench.bench import envinfo


def test_env_has_the_documented_keys_and_real_values(tmp_path):
    limits = {"dram_copy_GBps": 1.0}
    env = envinfo.collect_env(tmp_path, profile="ci", limits=limits)
    assert tuple(env) == envinfo.ENV_KEYS
    assert env["limits"] == limits
    assert env["profile"] == "ci"
    assert env["packages"]["numpy"] == np.__version__
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert env["cpu_count"] == os.cpu_count()
    assert env["ram_bytes"] > 0
    storage = env["storage"]
    assert storage["data_dir"] == str(tmp_path.resolve())
    # The same filesystem type findmnt (util-linux) reports for the directory.
    found = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", str(tmp_path)],
                           capture_output=True, text=True)
    if found.returncode == 0:
        assert storage["fs_type"] == found.stdout.split()[0]
    if storage["device"] is not None:
        dev = os.stat(tmp_path).st_dev
        assert storage["dev"] == f"{os.major(dev)}:{os.minor(dev)}"
    path = envinfo.write_env(tmp_path / "out" / "env.json", env)
    assert envinfo.read_env(path) == json.loads(json.dumps(env))


def test_missing_data_dir_is_described_by_its_nearest_existing_parent(tmp_path):
    storage = envinfo.storage_info(tmp_path / "not" / "yet")
    assert storage["data_dir"] == str((tmp_path / "not" / "yet").resolve())
    assert storage["fs_type"]


def test_read_env_names_missing_keys(tmp_path):
    path = tmp_path / "env.json"
    path.write_text(json.dumps({"env_version": 1}))
    with pytest.raises(ValueError, match=r"env.json lacks \[.*'cpu_model'"):
        envinfo.read_env(path)


def test_git_commit_and_dirty_flag(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c",
                        "user.email=t@example.com", *args], check=True, capture_output=True)

    git("init", "-q")
    assert envinfo.git_state(tmp_path)["commit"] is None
    (tmp_path / "f.txt").write_text("one")
    git("add", "f.txt")
    git("commit", "-q", "-m", "first")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert envinfo.git_state(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "f.txt").write_text("two")
    assert envinfo.git_state(tmp_path) == {"commit": head, "dirty": True}


def test_collecting_imports_neither_torch_nor_tensorflow(tmp_path):
    code = (
        "import sys, storebench.bench.envinfo as e\n"
        f"e.collect_env({str(tmp_path)!r})\n"
        "print(sorted(m for m in ('torch', 'tensorflow') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("a driver is present: the torch probe runs (in a subprocess)")
    assert out.stdout.strip() == "[]"
