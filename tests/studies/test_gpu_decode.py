"""The gpu_decode study without a GPU: the crop plan and the crop on the CPU, the case logic
through a fake ``Device`` that records its calls, the device cases as skipped rows saying
why, the CPU cores curve on the ci set, the figures and findings from rows (measured and
skipped), and ``make gpu-study``'s CPU path."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from gpu_decode_fakes import FakeDevice

from storebench import gpu_study
from storebench.bench.case import Case, CaseOutcome, CaseSkipped, Trial
from storebench.bench.runner import case_rows, run_cases
from storebench.bench.schema import make_row, read_results, validate
from storebench.bench.worker import _check_metrics
from storebench.loaders.device import (
    CROP_SIZE,
    DeviceUnavailableError,
    crop_flip_torch,
    crop_plan,
    decode_crop_reference,
    open_device,
)
from storebench.loaders.transforms import ScaledJpegDecode
from storebench.results import Results
from storebench.studies.gpu_decode import cases, study
from storebench.studies.gpu_decode import grid as decode_grid
from storebench.studies.gpu_decode import guide as decode_guide
from storebench.studies.gpu_decode import report as decode_report

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NO_DRIVER = not (Path("/proc/driver/nvidia/version").exists())
needs_no_gpu = pytest.mark.skipif(not NO_DRIVER, reason="this machine has an NVIDIA driver")
RUN = "20260101T000000Z-aaaaaa"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu-decode")
    decode_grid.prepare(profile="ci", data_dir=root)
    return root


@pytest.fixture(scope="module")
def encoded(data_dir) -> list[bytes]:
    case = decode_grid.grid(profile="ci", data_dir=data_dir, families=("device",))[0]
    return cases.load_encoded(case)


def by_function(grid: list[Case], family: str) -> list[Case]:
    return [c for c in grid if c.function.endswith(decode_grid.FUNCTIONS[family])]


# -- the crop ---------------------------------------------------------------------------
def test_a_crop_plan_is_a_function_of_seed_and_batch_and_stays_inside_the_image():
    shapes = [(375, 500)] * 64
    plan = crop_plan(shapes, seed=3, batch=1)
    again = crop_plan(shapes, seed=3, batch=1)
    other = crop_plan(shapes, seed=3, batch=2)
    assert np.array_equal(plan.boxes, again.boxes) and np.array_equal(plan.flips, again.flips)
    assert not np.array_equal(plan.boxes, other.boxes)
    y, x, h, w = plan.boxes.T
    assert (y >= 0).all() and (x >= 0).all() and (y + h <= 375).all() and (x + w <= 500).all()
    area = h * w / (375 * 500)
    assert (area >= 0.07).all() and (area <= 1.0).all()
    assert 0 < plan.flips.sum() < 64  # both ways, at this count
    assert len(plan) == 64 and plan.size == CROP_SIZE


def test_the_crop_of_a_box_of_the_output_size_is_the_pixels_themselves_and_a_flip_mirrors():
    import torch

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (2, 300, 400, 3), dtype=np.uint8)
    plan = cases_plan(boxes=[(10, 20, 224, 224), (50, 100, 224, 224)], flips=[False, True])
    out = crop_flip_torch(torch.from_numpy(images).permute(0, 3, 1, 2), plan)
    out = out.permute(0, 2, 3, 1).numpy()
    assert np.array_equal(out[0], images[0, 10:234, 20:244])
    assert np.array_equal(out[1], images[1, 50:274, 100:324][:, ::-1])


def cases_plan(*, boxes, flips):
    from storebench.loaders.device import CropPlan

    return CropPlan(np.array(boxes, dtype=np.int64), np.array(flips, dtype=bool))


def test_a_whole_image_box_is_resized_to_the_crop_size(encoded):
    plan = cases_plan(boxes=[(0, 0, 375, 500)], flips=[False])
    out = decode_crop_reference(encoded[:1], plan)
    assert out.shape == (1, CROP_SIZE, CROP_SIZE, 3) and out.dtype == np.uint8
    whole = simplejpeg.decode_jpeg(encoded[0], colorspace="RGB")
    # The corners sample the image's corners (within the bilinear filter's reach).
    assert np.abs(out[0, 0, 0].astype(int) - whole[0, 0].astype(int)).max() <= 12


def test_reduced_size_decode_keeps_at_least_the_crop_size(encoded):
    scaled = ScaledJpegDecode(CROP_SIZE, CROP_SIZE)
    image = scaled(encoded[0])
    assert scaled.scaled_shape(encoded[0]) == image.shape
    assert CROP_SIZE <= image.shape[0] < 375 and CROP_SIZE <= image.shape[1] < 500
    assert np.array_equal(image, simplejpeg.decode_jpeg(
        encoded[0], colorspace="RGB", min_height=CROP_SIZE, min_width=CROP_SIZE))
    with pytest.raises(ValueError, match="min_height must be a positive integer"):
        ScaledJpegDecode(0, 224)


# -- the grid ---------------------------------------------------------------------------
def test_the_grid_sweeps_the_hardware_decoder_load_and_names_every_family(tmp_path):
    grid = decode_grid.grid(profile="ci", data_dir=tmp_path)
    dali = [dict(c.params)["hw_decoder_load"] for c in by_function(grid, "device")
            if dict(c.params)["library"] == "dali"]
    assert 0.0 in dali and "default" in dali
    assert {dict(c.params)["library"] for c in by_function(grid, "device")} == {
        "dali", "nvimgcodec", "torchvision"}
    (demand,) = by_function(grid, "demand")
    assert demand.batch_size == 256 and dict(demand.params)["precision"] == "bf16"
    cpu = by_function(grid, "cpu")
    assert {dict(c.params)["decode"] for c in cpu} == {"full", "reduced"}
    assert {c.workers for c in cpu} == set(decode_grid.core_counts(len(os.sched_getaffinity(0))))
    assert {dict(c.params)["demand_samples_per_s"] for c in cpu} == {decode_grid.EMULATED_DEMAND}
    assert all(c.dataset == str(tmp_path / "gpu_decode" / "lmdb-jpeg") for c in grid)
    measured = decode_grid.grid(profile="ci", data_dir=tmp_path, families=("cpu",),
                                demand_samples_per_s=2901.27, demand_source="resnet50")
    assert {dict(c.params)["demand_samples_per_s"] for c in measured} == {2901.3}
    assert {dict(c.params)["demand_source"] for c in measured} == {"resnet50"}


def test_core_counts_are_powers_of_two_below_the_cores_and_all_of_them():
    assert decode_grid.core_counts(16) == (1, 2, 4, 8, 16)
    assert decode_grid.core_counts(12) == (1, 2, 4, 8, 12)
    assert decode_grid.core_counts(2) == (1, 2)
    assert decode_grid.core_counts(1) == (1,)


def test_timed_batches_are_whole_rounds_of_the_workers():
    assert cases.timed_batches(8, 1) == 8
    assert cases.timed_batches(8, 16) == 64
    assert cases.timed_batches(8, 3) == 12
    assert cases.timed_batches(30, 4) == 32


# -- the device cases through a fake device ---------------------------------------------
def device_case(data_dir, library="dali", **params) -> Case:
    grid = by_function(decode_grid.grid(profile="ci", data_dir=data_dir), "device")
    case = next(c for c in grid if dict(c.params)["library"] == library)
    return dataclasses.replace(case, params={**dict(case.params), **params})


def test_decode_on_device_runs_the_batches_then_checks_against_its_fallback(data_dir,
                                                                             monkeypatch):
    fake = FakeDevice()
    monkeypatch.setattr(cases, "resolve", lambda path: lambda: fake)
    case = device_case(data_dir, hw_decoder_load=0.0)
    metrics = cases.decode_on_device_case(case, Trial(case, 0))
    _check_metrics(case, metrics, {})  # the units the worker accepts
    batches = case.param("timed_samples") // case.batch_size
    runs = [c for c in fake.calls if c[0] == "run"]
    assert runs == ([("run", "dali", False, case.batch_size)]
                    * (cases.DEVICE_WARMUP_BATCHES + batches + 1)
                    + [("run", "dali", True, case.batch_size)])
    assert fake.calls[0] == ("open_decoder", "dali", case.batch_size, 0.0, False)
    assert ("open_decoder", "dali", case.batch_size, 0.0, True) in fake.calls
    # Timed between a synchronize and a synchronize; every decoder and the device closed.
    timed = fake.calls.index(("reset_memory_peak",))
    assert fake.calls[timed - 1] == ("synchronize",)
    assert fake.calls[timed + batches + 1] == ("synchronize",)
    assert fake.calls[-1] == ("close",)
    assert {c for c in fake.calls if c[0] == "close_decoder"} == {
        ("close_decoder", "dali", False), ("close_decoder", "dali", True)}
    assert metrics["samples"] == (case.param("timed_samples"), "count")
    assert metrics["fallback_mean_diff_levels"][0] == 0.0
    assert metrics["fallback_equal_fraction"][0] == 1.0
    assert metrics["ours_max_diff_levels"][0] == 0.0
    assert metrics["device_used_bytes"] == (3 << 30, "bytes")
    assert metrics["samples_per_s"][0] > 0 and metrics["cpu_cores_busy"][0] >= 0


def test_the_default_hardware_decoder_load_is_left_to_dali(data_dir, monkeypatch):
    fake = FakeDevice()
    monkeypatch.setattr(cases, "resolve", lambda path: lambda: fake)
    case = device_case(data_dir, hw_decoder_load="default")
    cases.decode_on_device_case(case, Trial(case, 0))
    assert fake.calls[0] == ("open_decoder", "dali", case.batch_size, None, False)


def test_a_device_decode_far_from_its_fallback_fails_the_case(data_dir, monkeypatch):
    fake = FakeDevice(offset=3)
    monkeypatch.setattr(cases, "resolve", lambda path: lambda: fake)
    case = device_case(data_dir, "nvimgcodec")
    with pytest.raises(RuntimeError, match=r"nvimgcodec on the device differs from its own "
                                           r"CPU fallback by 3\.\d\d grey levels on average "
                                           r"\(tolerance 1\.0\)"):
        cases.decode_on_device_case(case, Trial(case, 0))
    assert fake.calls[-1] == ("close",)


def test_the_model_demand_times_its_steps_after_the_warm_up(data_dir, monkeypatch):
    fake = FakeDevice()
    monkeypatch.setattr(cases, "resolve", lambda path: lambda: fake)
    (case,) = by_function(decode_grid.grid(profile="ci", data_dir=data_dir), "demand")
    metrics = cases.model_demand_case(case, Trial(case, 0))
    _check_metrics(case, metrics, {})
    assert fake.calls == [
        ("model_steps", 256), ("steps", cases.MODEL_WARMUP_STEPS), ("synchronize",),
        ("reset_memory_peak",), ("steps", cases.MODEL_TIMED_STEPS), ("synchronize",),
        ("memory",), ("close",)]
    assert metrics["samples"] == (256 * cases.MODEL_TIMED_STEPS, "count")


@needs_no_gpu
def test_without_a_device_the_device_cases_are_skipped_saying_why(data_dir):
    with pytest.raises(DeviceUnavailableError, match="no NVIDIA driver on this machine"):
        open_device()
    for case in decode_grid.grid(profile="ci", data_dir=data_dir, families=("device", "demand")):
        function = getattr(cases, case.function.partition(":")[2])
        with pytest.raises(CaseSkipped, match="no NVIDIA driver on this machine"):
            function(case, Trial(case, 0))


@needs_no_gpu
@pytest.mark.timeout(300)
def test_the_runner_writes_a_skipped_row_per_device_case_and_ok_rows_from_a_fake(data_dir,
                                                                                  tmp_path):
    grid = decode_grid.grid(profile="ci", data_dir=data_dir, repeats=1,
                            families=("device", "demand"))
    results = tmp_path / "gpu_decode.csv"
    run_cases(grid, results, profile="ci", progress=False)
    rows = read_results(results)
    assert set(rows["status"]) == {"skipped"}
    assert set(rows["case_id"]) == {c.case_id for c in grid}
    assert all("no NVIDIA driver on this machine" in e for e in rows["error"])
    faked = [dataclasses.replace(c, params={**dict(c.params),
                                             "device_factory": "gpu_decode_fakes:fake_device"})
             for c in grid if c.param("library") == "torchvision"]
    run_cases(faked, tmp_path / "faked.csv", profile="ci", progress=False,
              python_path=[HERE])
    rows = read_results(tmp_path / "faked.csv")
    assert set(rows["status"]) == {"ok"}
    assert rows.loc[rows["metric"] == "fallback_mean_diff_levels", "value"].tolist() == [0.0]


# -- the CPU cores curve ----------------------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("decode", ["full", "reduced"])
def test_the_cpu_decode_case_delivers_and_feeds_an_emulated_accelerator(data_dir, decode):
    import psutil

    grid = by_function(decode_grid.grid(profile="ci", data_dir=data_dir), "cpu")
    case = next(c for c in grid if c.param("decode") == decode and c.workers == 1)
    # Servers other tests' session fixtures started are this process's children too.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    metrics = cases.cpu_decode_feed_case(case, Trial(case, 0))
    _check_metrics(case, metrics, {})
    height = 375 if decode == "full" else ScaledJpegDecode(CROP_SIZE, CROP_SIZE).scaled_shape(
        cases.load_encoded(case)[0])[0]
    assert metrics["decoded_height"] == (height, "count")
    assert metrics["samples"][0] == cases.timed_batches(2, 1) * case.batch_size
    assert 0 < metrics["accelerator_utilisation"][0] <= 1
    assert metrics["demand_samples_per_s"] == (decode_grid.EMULATED_DEMAND, "samples/s")
    assert metrics["device_copies"] == (0.0, "count")
    # The prefetch workers are gone (multiprocessing's resource tracker stays, by design).
    assert [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())] == []


# -- figures, findings and the guide from rows ------------------------------------------
def rows_of(case: Case, metrics: dict[str, float], *, status: str = "ok", error: str = ""):
    records = tuple({"repeat": repeat, "metric": name, "value": value * (1 + 0.01 * repeat),
                     "unit": unit, "resident_fraction": None}
                    for repeat in range(3) for name, (value, unit) in metrics.items())
    outcome = CaseOutcome(status, 1.0, records if status == "ok" else (), error)
    return case_rows(case, outcome, run_id=RUN, profile="small")


def measured_rows(data_dir: Path) -> list[dict]:
    grid = decode_grid.grid(profile="small", data_dir=data_dir)
    rows = []
    for k, case in enumerate(by_function(grid, "device")):
        rows += rows_of(case, {"samples_per_s": (4000.0 + 700 * k, "samples/s"),
                               "cpu_cores_busy": (1.5 + 0.5 * k, "ratio"),
                               "device_used_bytes": (2.5e9, "bytes"),
                               "fallback_mean_diff_levels": (0.25, "count"),
                               "fallback_max_diff_levels": (9.0, "count"),
                               "ours_mean_diff_levels": (0.75, "count")})
    (demand,) = by_function(grid, "demand")
    rows += rows_of(demand, {"samples_per_s": (2900.0, "samples/s")})
    template = by_function(decode_grid.grid(profile="small", data_dir=data_dir, families=("cpu",),
                                            demand_samples_per_s=2900.0,
                                            demand_source="resnet50"), "cpu")[0]
    for decode in ("full", "reduced"):
        for prefetcher in ("thread", "process"):
            for workers in (1, 2, 4, 8, 16):
                rate = (1200.0 if decode == "full" else 2400.0) * workers ** 0.9
                case = dataclasses.replace(template, prefetcher=prefetcher, workers=workers,
                                           params={**dict(template.params), "decode": decode})
                rows += rows_of(case, {"samples_per_s": (rate, "samples/s"),
                                       "cpu_cores_busy": (workers * 0.95, "ratio"),
                                       "accelerator_utilisation": (min(1.0, rate / 2900), "ratio"),
                                       "demand_samples_per_s": (2900.0, "samples/s")})
    return rows


def skipped_rows(data_dir: Path) -> list[dict]:
    reason = "no NVIDIA driver on this machine (no /proc/driver/nvidia/version, no nvidia-smi)"
    grid = decode_grid.grid(profile="ci", data_dir=data_dir)
    return [row for case in grid for row in rows_of(case, {}, status="skipped", error=reason)]


def results_of(rows: list[dict]) -> Results:
    import pandas as pd

    return Results(validate(pd.DataFrame([make_row(**row) for row in rows])), {}, None)


def save(fig, name: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{name}.png"
    fig.savefig(path, dpi=80)
    return path


def test_the_figures_draw_measured_rows(tmp_path):
    results = results_of(measured_rows(tmp_path))
    for spec in study.STUDY.figures:
        fig = spec.draw(results)
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert not any(t.startswith("not measured") for t in texts), spec.name
        assert save(fig, spec.name, tmp_path).stat().st_size > 10_000
    cores = decode_report.plot_cores(results.df)
    (ax,) = cores.axes
    labels = [line.get_label() for line in ax.get_lines()]
    assert "demand: 2.93k samples/s (ResNet-50 step, measured)" in labels
    assert len(labels) == 5  # two decodes x two prefetchers, and the demand
    bars = decode_report.plot_gpu_vs_cpu(results.df)
    assert len(bars.axes[0].patches) == 6 + 4 * 2  # six device paths, four CPU lines x2


def test_with_only_skipped_rows_every_figure_says_what_was_not_measured_and_why(tmp_path):
    results = results_of(skipped_rows(tmp_path))
    for spec in study.STUDY.figures:
        fig = spec.draw(results)
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert any(t.startswith("not measured:") and "no NVIDIA driver" in t.replace("\n", " ")
                   for t in texts), (spec.name, texts)
        save(fig, spec.name, tmp_path)


def test_findings_and_guide_from_measured_rows(tmp_path):
    results = results_of(measured_rows(tmp_path))
    sentences = decode_report.findings(results)
    assert sentences[0].startswith("ResNet-50 training steps (bf16 autocast, channels_last, "
                                   "batch 256) ran at 2.93k samples/s")
    assert "DALI mixed, hw_decoder_load=0.0 4.0" in sentences[1]
    assert "mean difference from its CPU fallback 0.25 grey levels" in sentences[1]
    # 90% of 2,900 samples/s: whole images from 4 workers (1,200 x 4^0.9), reduced from 2.
    cores = {s.split(":")[0]: s for s in sentences[2:]}
    assert cores["simplejpeg whole-image, ThreadPrefetcher"].split(": ")[1].startswith(
        "4 cores keep the accelerator at 2.93k samples/s")
    assert cores["simplejpeg reduced-size, ProcessPrefetcher"].split(": ")[1].startswith(
        "2 cores keep")
    rows = decode_guide.guide(results)
    assert [row.question.split(":")[0] for row in rows] == [
        "JPEG (375x500) decoded on the CPU with 16 cores", "JPEG (375x500) decoded, cropped "
        "and flipped on the GPU"]
    assert rows[1].candidates[0].label == "torchvision.io (nvJPEG)"


def test_findings_from_skipped_rows_say_why_and_the_guide_is_empty(tmp_path):
    results = results_of(skipped_rows(tmp_path))
    sentences = decode_report.findings(results)
    assert sentences[0].startswith("The ResNet-50 step was not measured: no NVIDIA driver")
    assert "emulated at 1.79k samples/s" in sentences[0]
    assert sentences[1].startswith("Decode on the device was not measured: no NVIDIA driver")
    assert sentences[2].startswith("The CPU decode curve was not measured: no NVIDIA driver")
    assert decode_guide.guide(results) == []


# -- the one command --------------------------------------------------------------------
def test_the_packages_wanted_follow_the_cuda_version():
    assert gpu_study.wanted_packages(None) == gpu_study.CPU_PACKAGES
    wanted = dict(gpu_study.wanted_packages(13))
    assert wanted["nvidia.nvimgcodec"] == ("nvidia-nvimgcodec-cu13", "nvidia-nvjpeg")
    assert wanted["nvidia.dali"] == ("nvidia-dali-cuda130",)
    assert dict(gpu_study.wanted_packages(12))["nvidia.dali"] == ("nvidia-dali-cuda120",)


def test_only_what_does_not_import_is_installed_from_the_wheels_given(tmp_path):
    commands = []

    def run(command, **options):
        commands.append(command)
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution")

    report = gpu_study.install_missing(
        [("json", ("not-used",)), ("not_a_module_here", ("dist-a", "dist-b"))],
        wheels=tmp_path, run=run)
    assert report == {"json": "present", "not_a_module_here":
                      "not installed (dist-a dist-b): ERROR: No matching distribution"}
    assert commands == [[sys.executable, "-m", "pip", "install", "-q",
                         "--disable-pip-version-check", "--retries", "0", "--timeout", "10",
                         "--no-index", "--find-links", str(tmp_path), "dist-a", "dist-b"]]
    assert "--no-index" not in gpu_study.pip_command(["x"], wheels=None)


@needs_no_gpu
@pytest.mark.timeout(900)
def test_make_gpu_study_without_a_device_writes_skipped_rows_and_exits_0(tmp_path):
    done = subprocess.run(
        ["make", "-s", "gpu-study", f"PYTHON={sys.executable}", f"GPU_RUNS={tmp_path / 'runs'}",
         f"GPU_DATA={tmp_path / 'data'}", "GPU_PROFILE=ci", "GPU_REPEATS=1",
         f"GPU_WHEELS={tmp_path / 'none'}"],
        cwd=REPO, capture_output=True, text=True, timeout=880,
        env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    rows = read_results(run / "gpu_decode.csv")
    family = rows["case_id"].str.partition(":")[0]
    device = rows[family.isin(["decode_on_device", "model_demand"])]
    assert set(device["status"]) == {"skipped"} and len(set(device["case_id"])) == 7
    assert all("no NVIDIA driver on this machine" in e for e in device["error"])
    cpu = rows[family == "cpu_decode_feed"]
    assert set(cpu["status"]) == {"ok"}
    assert {json.loads(p)["demand_source"] for p in cpu["params"]} == {"emulated"}
    assert json.loads((run / "env.json").read_text())["run_id"] == run.name
    assert {p.name for p in (run / "figures").iterdir()} == {
        f"{spec.name}{suffix}" for spec in study.STUDY.figures for suffix in (".png", ".svg")}
    assert "gpu-study: simplejpeg: present" in done.stdout
    assert "- Decode on the device was not measured: no NVIDIA driver" in done.stdout


def test_the_cuda_wheels_library_folders_are_found_on_the_path(tmp_path):
    (tmp_path / "site" / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (tmp_path / "site" / "nvidia" / "nvimgcodec").mkdir(parents=True)
    found = gpu_study.nvidia_library_dirs([str(tmp_path / "site"), str(tmp_path / "none"), ""])
    assert found == [str(tmp_path / "site" / "nvidia" / "cu13" / "lib")]
