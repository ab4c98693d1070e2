"""Decode on the accelerator and a real model's step, behind one interface: ``Device``.

Every call that needs a GPU goes through a ``Device``: opening a JPEG decoder of one library
(DALI's ``decoders.image(device="mixed")``, nvImageCodec's batch decode,
``torchvision.io.decode_jpeg(device="cuda")``) and running it on a batch, a ResNet-50
training step, synchronising, and reading the device's memory. ``open_device()`` gives the
CUDA one, or raises ``DeviceUnavailableError`` saying why there is none; the gpu_decode
study's cases turn that into a ``skipped`` row. Tests hand the cases a fake ``Device`` that
records its calls, so the case logic (batching, timing, the checks) runs on any machine.

Each decoder also decodes on the CPU (``on_cpu=True``): its own fallback, against which the
device's output is checked. The crop and flip are the standard training augmentation
(torchvision's ``RandomResizedCrop(224)`` and ``RandomHorizontalFlip``), drawn on the host
by ``crop_plan`` from ``default_rng([seed, batch])`` so that the device and every check see
the same boxes; the device applies them (bilinear, no antialiasing, ``crop_flip_torch``; DALI
with its own ``fn.resize`` and ``fn.flip``, in the graph ``dali_crop_graph`` builds for the
CPU and the mixed pipeline alike).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from .train_transform import crop_box

CROP_SIZE = 224
# torchvision's RandomResizedCrop defaults: the crop's share of the area, its aspect ratio.
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
DECODE_LIBRARIES = ("dali", "nvimgcodec", "torchvision")
# The ResNet-50 step: ImageNet's 1,000 classes, SGD with momentum, as its reference recipe.
MODEL_CLASSES = 1000


class DeviceUnavailableError(RuntimeError):
    """No device for this call (no CUDA, or a library missing): the message says which."""


@dataclass(frozen=True)
class CropPlan:
    """Per sample of one batch: the crop box ``(y, x, height, width)`` in the decoded image
    and whether it is flipped left to right; every crop is resized to ``size`` squared."""

    boxes: np.ndarray
    flips: np.ndarray
    size: int = CROP_SIZE

    def __len__(self) -> int:
        return len(self.boxes)


def crop_plan(shapes: Sequence[tuple[int, int]], *, seed: int, batch: int,
              size: int = CROP_SIZE) -> CropPlan:
    """Random-resized-crop boxes and flips for images of ``shapes`` (height, width), drawn
    as torchvision's ``RandomResizedCrop.get_params`` draws them (ten tries at a random
    area share and log-uniform aspect ratio, then the centre crop at the nearest allowed
    ratio), from ``default_rng([seed, batch])``."""
    rng = np.random.default_rng([seed, batch])
    boxes = np.empty((len(shapes), 4), dtype=np.int64)
    for i, (height, width) in enumerate(shapes):
        boxes[i] = crop_box(rng, height, width, scale=CROP_SCALE, ratio=CROP_RATIO)
    flips = rng.random(len(shapes)) < 0.5
    return CropPlan(boxes, flips, size)


def crop_theta(plan: CropPlan, height: int, width: int) -> np.ndarray:
    """The (n, 2, 3) affine matrices that ``torch.nn.functional.affine_grid`` turns into
    sampling grids for the plan's crops (align_corners=False: pixel centres), a flip being a
    negative horizontal scale."""
    y, x, h, w = (plan.boxes[:, k].astype(np.float64) for k in range(4))
    theta = np.zeros((len(plan), 2, 3), dtype=np.float32)
    theta[:, 0, 0] = np.where(plan.flips, -w / width, w / width)
    theta[:, 0, 2] = (2 * x + w) / width - 1
    theta[:, 1, 1] = h / height
    theta[:, 1, 2] = (2 * y + h) / height - 1
    return theta


def crop_flip_torch(images, plan: CropPlan):
    """The plan's crops of ``images`` (an (n, 3, H, W) uint8 torch tensor, on any device),
    resized bilinearly to ``plan.size`` squared and flipped where the plan says: one batched
    ``grid_sample``, (n, 3, size, size) uint8 on the same device."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own name for it

    n, channels, height, width = images.shape
    theta = torch.from_numpy(crop_theta(plan, height, width)).to(images.device)
    grid = F.affine_grid(theta, [n, channels, plan.size, plan.size], align_corners=False)
    out = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="border",
                        align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def decode_crop_reference(encoded: Sequence[bytes], plan: CropPlan) -> np.ndarray:
    """Our CPU path for the same batch: simplejpeg decodes, ``crop_flip_torch`` on the CPU
    crops; (n, size, size, 3) uint8, what every device decoder is compared with."""
    import simplejpeg
    import torch

    images = np.stack([simplejpeg.decode_jpeg(data, colorspace="RGB") for data in encoded])
    out = crop_flip_torch(torch.from_numpy(images).permute(0, 3, 1, 2), plan)
    return out.permute(0, 2, 3, 1).numpy()


class Decoder(Protocol):
    """One library's decoder, opened by ``Device.open_decoder``: ``run`` decodes a batch
    of JPEG bytes and applies the crop plan, leaving the result where it decoded it;
    ``to_host`` gives that result as (n, size, size, 3) uint8."""

    def run(self, encoded: Sequence[bytes], plan: CropPlan): ...

    def to_host(self, batch) -> np.ndarray: ...

    def close(self) -> None: ...


class Device(Protocol):
    """Everything the gpu_decode study asks of an accelerator."""

    name: str
    # What ``GpuFeeder(device=...)`` copies to ("cuda:0"; "cpu" for an emulated one).
    feed_device: str

    def open_decoder(self, library: str, *, batch_size: int,
                     hw_decoder_load: float | None = None, on_cpu: bool = False,
                     threads: int = 4) -> Decoder: ...

    def model_steps(self, *, batch_size: int) -> Callable[[int], None]: ...

    def synchronize(self) -> None: ...

    def reset_memory_peak(self) -> None: ...

    def memory(self) -> dict[str, int]: ...

    def close(self) -> None: ...


def open_device(index: int = 0) -> Device:
    """The CUDA device ``index`` through torch, or ``DeviceUnavailableError`` naming why
    there is none."""
    if not (Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi")):
        raise DeviceUnavailableError("no NVIDIA driver on this machine (no "
                                     "/proc/driver/nvidia/version, no nvidia-smi)")
    try:
        import torch
    except ImportError as err:
        raise DeviceUnavailableError(f"torch does not import: {err}") from err
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"no CUDA device: torch {torch.__version__} reports torch.cuda.is_available() "
            "== False")
    return CudaDevice(index)


class CudaDevice:
    """The ``Device`` of a CUDA GPU, through torch (and DALI, nvImageCodec, torchvision)."""

    def __init__(self, index: int = 0) -> None:
        import torch

        self.index = index
        self.feed_device = f"cuda:{index}"
        self.name = torch.cuda.get_device_name(index)

    def open_decoder(self, library: str, *, batch_size: int,
                     hw_decoder_load: float | None = None, on_cpu: bool = False,
                     threads: int = 4) -> Decoder:
        if library == "dali":
            return DaliDecoder(None if on_cpu else self.index, batch_size=batch_size,
                               hw_decoder_load=hw_decoder_load, threads=threads)
        if library == "nvimgcodec":
            return NvImageCodecDecoder(self.index, on_cpu=on_cpu)
        if library == "torchvision":
            return TorchvisionDecoder(self.index, on_cpu=on_cpu)
        raise KeyError(f"unknown decode library {library!r}; known: {list(DECODE_LIBRARIES)}")

    def model_steps(self, *, batch_size: int) -> Callable[[int], None]:
        return resnet50_steps(self.feed_device, batch_size=batch_size)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.index)

    def reset_memory_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.index)

    def memory(self) -> dict[str, int]:
        """``torch_peak_bytes``: what torch's allocator held at most since the last reset;
        ``device_used_bytes``: the whole device's memory in use now (DALI's and
        nvImageCodec's own allocations and the CUDA context included)."""
        import torch

        free, total = torch.cuda.mem_get_info(self.index)
        return {"torch_peak_bytes": int(torch.cuda.max_memory_allocated(self.index)),
                "device_used_bytes": int(total - free)}

    def close(self) -> None:
        """Nothing to release: torch keeps its context until the process ends."""


def _require(module: str, distribution: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise DeviceUnavailableError(
            f"{module} does not import ({err}): pip install {distribution}") from err


def resnet50_steps(device: str, *, batch_size: int) -> Callable[[int], None]:
    """``steps(n)``: n ResNet-50 training steps on ``device`` (bf16 autocast, channels_last,
    SGD with momentum) on one batch of synthetic images and labels already there."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own name for it

    models = _require("torchvision.models", "torchvision (the build matching torch)")
    torch.backends.cudnn.benchmark = True
    model = models.resnet50(weights=None, num_classes=MODEL_CLASSES).to(
        device, memory_format=torch.channels_last)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator(device=device).manual_seed(0)
    images = torch.randn(batch_size, 3, CROP_SIZE, CROP_SIZE, device=device,
                         generator=generator).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, MODEL_CLASSES, (batch_size,), device=device, generator=generator)
    device_type = torch.device(device).type

    def steps(n: int) -> None:
        for _ in range(n):
            with torch.autocast(device_type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()

    return steps


def dali_crop_graph(*, decode_device: str, hw_decoder_load: float | None):
    """The DALI graph of the decode cases, for a pipeline on the CPU (``decode_device``
    "cpu") or the GPU ("mixed"): the JPEG bytes, crop boxes and flips fed from the host
    (``external_source``: "jpegs", "crop_start", "crop_end", "flip"), decoded, the box
    resized to 224 squared (linear, no antialiasing) and flipped."""
    from nvidia.dali import fn, types

    jpegs = fn.external_source(name="jpegs", dtype=types.UINT8, ndim=1)
    start = fn.external_source(name="crop_start", dtype=types.FLOAT, ndim=1)
    end = fn.external_source(name="crop_end", dtype=types.FLOAT, ndim=1)
    flip = fn.external_source(name="flip", dtype=types.INT32, ndim=0)
    options = {}
    if decode_device == "mixed" and hw_decoder_load is not None:
        options["hw_decoder_load"] = float(hw_decoder_load)
    images = fn.decoders.image(jpegs, device=decode_device, output_type=types.RGB, **options)
    images = fn.resize(images, roi_start=start, roi_end=end, size=[CROP_SIZE, CROP_SIZE],
                       interp_type=types.INTERP_LINEAR, antialias=False)
    return fn.flip(images, horizontal=flip)


def dali_feeds(encoded: Sequence[bytes], plan: CropPlan) -> dict[str, list[np.ndarray]]:
    """What ``dali_crop_graph``'s external sources take for one batch, by name."""
    starts = plan.boxes[:, :2].astype(np.float32)
    ends = starts + plan.boxes[:, 2:].astype(np.float32)
    return {
        "jpegs": [np.frombuffer(data, dtype=np.uint8) for data in encoded],
        "crop_start": list(starts),
        "crop_end": list(ends),
        "flip": [np.array(flip, dtype=np.int32) for flip in plan.flips],
    }


class DaliDecoder:
    """DALI's ``decoders.image`` in the crop graph: ``device_id=None`` builds the CPU
    pipeline (its own fallback), a device index the mixed one."""

    def __init__(self, device_id: int | None, *, batch_size: int,
                 hw_decoder_load: float | None, threads: int) -> None:
        pipeline_def = _require("nvidia.dali", "nvidia-dali-cuda130 (or -cuda120)").pipeline_def

        decode_device = "cpu" if device_id is None else "mixed"

        @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=device_id,
                      prefetch_queue_depth=1, exec_async=False, exec_pipelined=False)
        def graph():
            return dali_crop_graph(decode_device=decode_device, hw_decoder_load=hw_decoder_load)

        self.on_gpu = device_id is not None
        self.pipe = graph()
        self.pipe.build()

    def run(self, encoded: Sequence[bytes], plan: CropPlan):
        for name, data in dali_feeds(encoded, plan).items():
            self.pipe.feed_input(name, data)
        (out,) = self.pipe.run()
        return out

    def to_host(self, batch) -> np.ndarray:
        return np.asarray((batch.as_cpu() if self.on_gpu else batch).as_array())

    def close(self) -> None:
        self.pipe = None


class _TorchCropDecoder:
    """A decoder whose images become one (n, 3, H, W) torch tensor on the device, cropped
    there by ``crop_flip_torch``."""

    def __init__(self, index: int, *, on_cpu: bool) -> None:
        self.device = f"cuda:{index}"
        self.on_cpu = on_cpu

    def decode(self, encoded: Sequence[bytes]):
        raise NotImplementedError

    def run(self, encoded: Sequence[bytes], plan: CropPlan):
        return crop_flip_torch(self.decode(encoded), plan)

    def to_host(self, batch) -> np.ndarray:
        return batch.permute(0, 2, 3, 1).cpu().numpy()

    def close(self) -> None:
        """Nothing beyond what the process releases."""


class NvImageCodecDecoder(_TorchCropDecoder):
    """nvImageCodec's batch ``Decoder.decode`` (its GPU backends, or ``CPU_ONLY``)."""

    def __init__(self, index: int, *, on_cpu: bool) -> None:
        super().__init__(index, on_cpu=on_cpu)
        nvimgcodec = _require("nvidia.nvimgcodec", "nvidia-nvimgcodec-cu13 (or -cu12)")
        backends = ([nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)] if on_cpu else None)
        self._decoder = nvimgcodec.Decoder(device_id=index, backends=backends)

    def decode(self, encoded: Sequence[bytes]):
        import torch

        images = self._decoder.decode(list(encoded))
        if self.on_cpu:
            stacked = torch.from_numpy(np.stack([np.asarray(image.cpu()) for image in images]))
            return stacked.to(self.device).permute(0, 3, 1, 2)
        return torch.stack([torch.as_tensor(image, device=self.device) for image in images]
                           ).permute(0, 3, 1, 2)


class TorchvisionDecoder(_TorchCropDecoder):
    """``torchvision.io.decode_jpeg`` on a list of encoded tensors (nvJPEG on the GPU,
    libjpeg-turbo on the CPU)."""

    def __init__(self, index: int, *, on_cpu: bool) -> None:
        super().__init__(index, on_cpu=on_cpu)
        self._io = _require("torchvision.io", "torchvision (the build matching torch)")

    def decode(self, encoded: Sequence[bytes]):
        import torch

        data = [torch.frombuffer(bytearray(item), dtype=torch.uint8) for item in encoded]
        images = self._io.decode_jpeg(data, device="cpu" if self.on_cpu else self.device)
        return torch.stack(images).to(self.device)
