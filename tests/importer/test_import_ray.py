"""``storebench import --engine ray``: the same datasets as the single-process import, the
same assignment whatever order Ray runs its tasks in, nothing valid and no Ray process left
after a kill, and one-line errors without Ray or without a cluster."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from image_folder import make_image_folder

import data_gen
from storebench import ray_import
from storebench.cli import main
from storebench.formats import build_dataset, find_datasets, open_dataset, read_manifest
from storebench.importer import (
    SourceImageError,
    ThreadImportEngine,
    import_images,
    plan_import,
)

# Not imported here: Ray must first be imported where storebench binds it to loopback.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="Ray is not installed (pip install 'storebench[ray]')")

RESIZE = (20, 24)
# What the manifest records about when and how fast a build ran, and the digest over it.
TIMING_FIELDS = ("write_seconds", "generate_seconds", "created_utc", "manifest_digest")
# Whether Ray's processes are gone after a killed import: bounded, never a hang.
SETTLE_S = 150


@pytest.fixture(scope="module")
def ray_session():
    """One loopback Ray for the module's in-process imports (the CLI tests start their own)."""
    with ray_import.local_ray(num_cpus=2) as ray:
        yield ray


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("my images")
    make_image_folder(root, per_class=6)
    return root


@pytest.fixture(scope="module")
def ci_folder(tmp_path_factory) -> Path:
    """The ci profile's JPEG set as an ImageFolder tree (its rawfiles copy)."""
    out = tmp_path_factory.mktemp("ci")
    spec = data_gen.PROFILES["ci"].spec_for("jpeg")
    return build_dataset(spec, "rawfiles", out).path


def both_imports(source: Path, out: Path) -> tuple[Path, Path]:
    single, distributed = out / "process", out / "ray"
    import_images(source, single, resize=RESIZE, progress=False)
    import_images(source, distributed, resize=RESIZE, progress=False, engine="ray")
    return single, distributed


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def without(manifest: dict, fields: tuple[str, ...]) -> dict:
    return {k: v for k, v in manifest.items() if k not in fields}


def assert_same_datasets(single: Path, distributed: Path) -> None:
    names = sorted(p.name for p in find_datasets(single))
    assert names == sorted(p.name for p in find_datasets(distributed))
    assert names  # every core format, encoded and raw
    for name in names:
        a, b = single / name, distributed / name
        assert (without(read_manifest(a), TIMING_FIELDS)
                == without(read_manifest(b), TIMING_FIELDS)), name
        files_a, files_b = files_under(a), files_under(b)
        assert sorted(files_a) == sorted(files_b), name
        for rel in files_a:
            if rel != "manifest.json":
                assert files_a[rel] == files_b[rel], f"{name}/{rel}"
        with open_dataset(a) as one, open_dataset(b) as other:
            for i in range(len(one)):
                image_a, label_a = one[i]
                image_b, label_b = other[i]
                assert label_a == label_b and np.array_equal(np.asarray(image_a),
                                                             np.asarray(image_b)), (name, i)


def test_the_mixed_folder_converts_to_the_same_datasets(ray_session, mixed_folder, tmp_path):
    assert_same_datasets(*both_imports(mixed_folder, tmp_path))


def test_the_ci_image_folder_converts_to_the_same_datasets(ray_session, ci_folder, tmp_path):
    assert_same_datasets(*both_imports(ci_folder, tmp_path))


def test_the_assignment_ignores_the_order_ray_runs_tasks_in(ray_session, mixed_folder):
    """Blocks of 4 images, 2 CPUs: tasks finish out of order; the plan and the samples the
    writers receive are those of the single-process engine, in the same order."""
    spec_of = lambda plan: plan.raw_spec  # noqa: E731  the resized copy: Ray tasks' work
    with ThreadImportEngine() as threads:
        want = plan_import(mixed_folder, resize=RESIZE, engine=threads)
        want_samples = list(threads.samples(want, spec_of(want))())
    with ray_import.RayImportEngine(images_per_task=4) as engine:
        for _ in range(2):
            got = plan_import(mixed_folder, resize=RESIZE, engine=engine)
            assert got.sources_sidecar() == want.sources_sidecar()
            assert (got.encoded_spec, got.raw_spec) == (want.encoded_spec, want.raw_spec)
            samples = list(engine.samples(got, spec_of(got))())
            assert [label for _, label in samples] == [label for _, label in want_samples]
            assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(samples, want_samples))
    assert ray_import.block_starts(10, 4) == range(0, 10, 4)


def test_a_damaged_image_is_named_as_by_the_single_process_import(ray_session, tmp_path):
    source = tmp_path / "source"
    bad = make_image_folder(source, per_class=2)[3]
    bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 2])
    with pytest.raises(SourceImageError) as single:
        import_images(source, tmp_path / "a", progress=False)
    with pytest.raises(SourceImageError) as distributed:
        import_images(source, tmp_path / "b", progress=False, engine="ray")
    assert str(distributed.value) == str(single.value) and str(bad) in str(single.value)
    assert not (tmp_path / "b").exists()
    skipped = import_images(source, tmp_path / "c", progress=False, engine="ray",
                            on_error="skip", formats=["parquet"])
    assert read_manifest(skipped[0].path)["num_samples"] == 5


def ray_processes(marker: str) -> list[str]:
    """The processes (ours, Ray's) whose environment holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(f"{entry.name} {(entry / 'cmdline').read_bytes()[:80]!r}")
        except OSError:
            continue
    return found


def assert_nothing_left(marker: str, temp: str) -> None:
    """No process of the run (Ray's, the guard) and no file in its temporary folder, once
    they had ``SETTLE_S`` to exit."""
    settle = time.monotonic() + SETTLE_S
    while (ray_processes(marker) or os.listdir(temp)) and time.monotonic() < settle:
        time.sleep(0.2)
    assert ray_processes(marker) == []
    assert os.listdir(temp) == []


def cli(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "storebench", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_a_killed_conversion_leaves_nothing_valid_and_no_ray_process(ci_folder, tmp_path):
    marker = f"STOREBENCH_TEST_RUN={os.getpid()}-{time.time_ns()}"
    # Ray's socket names must fit in 107 bytes: its temporary folder gets a short parent.
    with tempfile.TemporaryDirectory(prefix="sbt") as temp:
        env = {**os.environ, "TMPDIR": temp, marker.split("=")[0]: marker.split("=")[1]}
        env.pop("RAY_ADDRESS", None)
        out = tmp_path / "out"
        proc = cli(["import", str(ci_folder), "--out", str(out), "--resize", "20x24",
                    "--engine", "ray", "--workers", "1", "--quiet"], env)
        try:
            deadline = time.monotonic() + 300
            while proc.poll() is None and time.monotonic() < deadline:
                started = out.is_dir() and any(p.name.startswith(".tmp-") for p in out.iterdir())
                if started and any("raylet" in p for p in ray_processes(marker)):
                    break
                time.sleep(0.05)
            assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            proc.kill()
            proc.stdout.close()
        assert find_datasets(out) == []
        assert_nothing_left(marker, temp)
    # The next import sweeps the killed one's partial directories and builds in full.
    import_images(ci_folder, out, formats=["parquet"], progress=False)
    assert [p.name for p in out.iterdir()] == ["parquet-jpeg"]


def test_cli_converts_with_ray_and_writes_the_same_bytes(mixed_folder, tmp_path):
    marker = f"STOREBENCH_TEST_RUN={os.getpid()}-{time.time_ns()}"
    with tempfile.TemporaryDirectory(prefix="sbt") as temp:
        env = {**os.environ, "TMPDIR": temp, marker.split("=")[0]: marker.split("=")[1]}
        env.pop("RAY_ADDRESS", None)
        single, distributed = tmp_path / "process", tmp_path / "ray"
        for out, engine in ((single, "process"), (distributed, "ray")):
            proc = cli(["import", str(mixed_folder), "--out", str(out), "--engine", engine,
                        "--formats", "parquet", "rawfiles", "--workers", "1", "--quiet"], env)
            output = proc.communicate(timeout=300)[0].decode()
            assert proc.returncode == 0, output
            assert f"imported into {out}: 2 dataset(s)" in output
        assert_nothing_left(marker, temp)
    for name in ("parquet-mixed", "rawfiles-mixed"):
        a, b = files_under(single / name), files_under(distributed / name)
        assert {k: v for k, v in a.items() if k != "manifest.json"} == {
            k: v for k, v in b.items() if k != "manifest.json"}


def test_without_ray_the_cli_says_how_to_install_it(mixed_folder, tmp_path, monkeypatch,
                                                    capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where it is absent
    code = main(["import", str(mixed_folder), "--out", str(tmp_path / "out"), "--engine", "ray"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("storebench import: --engine ray needs Ray")
    assert "pip install 'storebench[ray]' (or make setup)" in err
    assert not (tmp_path / "out").exists()


def test_a_bad_address_is_one_line_and_writes_nothing(mixed_folder, tmp_path, capsys):
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = main(["import", str(mixed_folder), "--out", str(tmp_path / "out"), "--engine", "ray",
                 "--address", f"127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"storebench import: --address 127.0.0.1:{port}: no Ray cluster "
                          "answers there")
    assert not (tmp_path / "out").exists()


def test_an_address_needs_the_ray_engine(mixed_folder, tmp_path, capsys):
    code = main(["import", str(mixed_folder), "--out", str(tmp_path / "out"),
                 "--address", "127.0.0.1:6379"])
    assert code == 2
    assert capsys.readouterr().err == (
        "storebench import: --address names a Ray cluster: it needs --engine ray\n")
