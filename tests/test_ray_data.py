"""Ray Data's recipes (``storebench.loaders.peers.ray_data``): a local Ray that listens on
loopback only, leaves no process or directory behind, splits an epoch between ranks exactly
once, and says where it cannot go."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

import numpy as np
import psutil
import pytest

import data_gen
from storebench.formats import DatasetError, build_dataset
from storebench.loaders.paths import LOADER_PATHS, PathOptions
from storebench.recipes import RECIPES

pytest.importorskip("ray.data")

from storebench.loaders.peers.ray_data import (  # noqa: E402 - after the skip
    NO_RESUME,
    RAY_DATA_PATHS,
    RAY_ENVIRONMENT,
    RayDataBatches,
    rank_epochs,
    ray_processes,
    remove_stale_ray_dirs,
)

SAMPLES = data_gen.PROFILES["ci"].spec_for("jpeg").num_samples


@pytest.fixture(scope="module")
def jpeg_files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ray-data")
    build_dataset(data_gen.PROFILES["ci"].spec_for("jpeg"), "rawfiles", root, workers=1)
    return root / "rawfiles-jpeg"


def options(root: Path, **knobs) -> PathOptions:
    return PathOptions(batch_size=32, workers=2, seed=3, root=str(root), decode="simplejpeg",
                       transform="train", **knobs)


def listening_addresses(processes) -> set[str]:
    found = set()
    for process in processes:
        try:
            connections = process.net_connections(kind="inet")
        except psutil.Error:
            continue
        found |= {c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN}
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


@pytest.mark.timeout(300)
def test_an_epoch_is_every_sample_once_on_loopback_and_nothing_is_left(jpeg_files):
    environment = {name: os.environ.get(name) for name in RAY_ENVIRONMENT}
    batches = RayDataBatches(jpeg_files, options(jpeg_files))
    seen, addresses = [], set()
    try:
        for batch in batches:
            if not addresses:
                # While it runs: every server Ray started listens on loopback only.
                addresses = listening_addresses([psutil.Process(), *ray_processes()])
                temp_dir = batches.ray.temp_dir
                names = {p.name() for p in ray_processes()}
            assert batch.images.shape[1:] == (224, 224, 3) and batch.images.dtype == np.uint8
            seen += batch.indices.tolist()
        metrics = batches.engine_metrics()
    finally:
        batches.close()
    assert sorted(seen) == list(range(SAMPLES)) and seen != sorted(seen)
    assert addresses and all(is_loopback(a) for a in addresses), addresses
    assert {"gcs_server", "raylet"} <= names
    assert metrics["ray_engine_cpu_s"][0] > 0 and metrics["ray_spilled_bytes"] == (0, "bytes")
    # Closed: no raylet, GCS or worker left, its directory gone, the environment as it was.
    assert ray_processes() == []
    assert not Path(temp_dir).exists()
    assert {name: os.environ.get(name) for name in RAY_ENVIRONMENT} == environment


@pytest.mark.timeout(300)
def test_streaming_split_gives_each_rank_its_share_and_its_own_crops(jpeg_files):
    shares = rank_epochs(jpeg_files, 2, options(jpeg_files))
    indices = [np.concatenate([b.indices for b in share]) for share in shares]
    assert sorted(np.concatenate(indices).tolist()) == list(range(SAMPLES))
    assert all(len(i) for i in indices)
    assert ray_processes() == []


def test_a_ray_directory_left_by_a_dead_owner_is_removed_and_a_live_one_kept():
    import subprocess
    import sys
    import tempfile

    from storebench.loaders.peers import ray_data

    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    prefix = ray_data.TEMP_PREFIX
    dead = Path(tempfile.mkdtemp(prefix=f"{prefix}{exited.pid}-", dir=ray_data.TEMP_ROOT))
    (dead / "session_x").mkdir()
    live = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=ray_data.TEMP_ROOT))
    try:
        assert dead in remove_stale_ray_dirs()
        assert not dead.exists() and live.exists()
    finally:
        live.rmdir()


def test_a_rank_process_cannot_open_its_own_share(jpeg_files):
    with pytest.raises(DatasetError, match=r"Ray Data splits an epoch between ranks from one "
                                           r"driver \(Dataset.streaming_split"):
        LOADER_PATHS["ray_data_files"].open(None, None, options(jpeg_files, rank=1,
                                                                world_size=2))


def test_the_recipes_declare_ray_data_and_say_resume_is_missing():
    ray_recipes = [r for r in RECIPES.values() if r.loader in RAY_DATA_PATHS]
    assert {r.layout for r in ray_recipes} == {"rawfiles", "parquet", "webdataset"}
    for recipe in ray_recipes:
        assert recipe.environment == "main" and recipe.versions()["ray"] != "not installed"
        assert recipe.note == NO_RESUME and "ray-project/ray#37633" in NO_RESUME
        assert recipe.transform.filter == "antialiased"
        assert not recipe.serves("object storage")
        assert any("docs.ray.io" in t.advice for t in recipe.tuning)


# -- the correctness audit ---------------------------------------------------------------
# The ci study (tests/conftest.py's ci_study) audits one Ray Data recipe, as every recipe:
# these read its rows rather than start Ray for a second audit.
@pytest.fixture(scope="module")
def ray_audit_rows(ci_study):
    import pandas as pd

    rows = pd.read_csv(ci_study[0] / "correctness.csv")
    params = rows["params"].map(json.loads)
    audited = rows[params.map(lambda p: p.get("recipe", "").startswith("ray-data"))]
    assert set(audited["status"]) == {"ok"}
    return audited


def test_the_audit_splits_ray_data_exactly_once_between_ranks(ray_audit_rows):
    metrics = dict(zip(ray_audit_rows["metric"], ray_audit_rows["value"], strict=True))
    for setting in ("ranks3", "workers2"):
        assert metrics[f"exactly_once.{setting}.duplicates"] == 0, setting
        assert metrics[f"exactly_once.{setting}.misses"] == 0, setting
        assert metrics[f"exactly_once.{setting}.tag_mismatches"] == 0, setting
        assert metrics[f"exactly_once.{setting}.padding"] == 0, setting
    # Crops keyed by (seed, epoch, index): epochs draw apart, and ranks that got samples
    # too. A split hands out whole blocks: a rank may get nothing, and with fewer than two
    # ranks that delivered there is no comparison (the metric is absent).
    assert metrics["randomness.epochs.same_draws"] == 0.0
    assert not metrics.get("randomness.ranks3.sequence_match_max", 0.0) >= 0.5
    # A Ray worker process was found and killed; what Ray did then is the finding.
    assert metrics["killed_worker.workers2.hung"] in (0, 1)
    assert ray_processes() == []


def test_the_audit_table_says_ray_data_cannot_resume(ray_audit_rows):
    from storebench.studies.correctness import report

    row = report.correctness_table(ray_audit_rows).iloc[0]
    assert row["exactly_once"] == "pass" and "3 ranks" in row["exactly_once_text"]
    assert row["resume"] == "skipped"
    assert row["resume_text"] == f"unsupported by the library: {NO_RESUME}"
