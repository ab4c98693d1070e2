"""Batches as a training step takes them: torch tensors in the layout and dtype the model
wants, normalised on the host or on the device.

A loader delivers uint8 (B, H, W, C) batches. ``StepInput`` turns one into what FFCV's
``ToTensor -> ToDevice -> ToTorchImage -> NormalizeImage`` gives its users:

- ``layout="channels_last"`` (the default): an NCHW-shaped tensor whose memory is NHWC,
  torch's ``channels_last`` format, which convolutions on accelerators prefer. The loader's
  batch already lies so in memory: no copy is made. ``layout="nchw"`` copies it into
  contiguous NCHW.
- ``dtype="uint8"`` keeps the pixels; ``"float16"``, ``"bfloat16"`` or ``"float32"``
  normalise them, ``(x - mean) / std`` per channel, computed in float32.
- ``device="cuda"`` (or ``"cuda:1"``) copies the uint8 batch there, a quarter of the float
  bytes, and normalises there. The copy is asynchronous (``non_blocking``) where the batch
  lies in page-locked memory (a prefetcher made with ``pin_memory=True``), so it overlaps
  the step the device is running. Without CUDA, asking for it is refused at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LAYOUTS = ("channels_last", "nchw")
DTYPES = ("uint8", "float16", "bfloat16", "float32")
# ImageNet's per-channel mean and standard deviation, on the 0-255 scale.
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


@dataclass(frozen=True)
class StepInput:
    """uint8 (B, H, W, C) batches to torch tensors of shape (B, C, H, W): see the module
    docstring for ``layout``, ``dtype``, ``mean``/``std`` (0-255 scale, one value per
    channel) and ``device``."""

    layout: str = "channels_last"
    dtype: str = "uint8"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    device: str | None = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"StepInput: layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"StepInput: dtype must be one of {DTYPES}, got {self.dtype!r}")
        if len(self.mean) != len(self.std) or not all(s > 0 for s in self.std):
            raise ValueError(f"StepInput: mean and std need one value per channel, std > 0; "
                             f"got mean={self.mean}, std={self.std}")
        if self.device is not None and not str(self.device).startswith("cpu"):
            import torch

            from .gpu import AcceleratorUnavailableError

            if not torch.cuda.is_available():
                raise AcceleratorUnavailableError(
                    f"StepInput(device={self.device!r}): torch {torch.__version__} reports "
                    "torch.cuda.is_available() == False on this machine; use device=None "
                    "for host tensors")

    def __call__(self, images):
        """The batch ``images`` (a uint8 (B, H, W, C) NumPy array or torch tensor) as the
        step's input tensor."""
        import torch

        if isinstance(images, np.ndarray):
            if images.dtype != np.uint8 or images.ndim != 4:
                raise ValueError(f"StepInput takes uint8 (B, H, W, C) batches, got "
                                 f"{images.dtype} {images.shape}")
            images = torch.from_numpy(images)  # no copy: the tensor views the batch
        elif images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"StepInput takes uint8 (B, H, W, C) batches, got "
                             f"{images.dtype} {tuple(images.shape)}")
        if self.dtype != "uint8" and images.shape[3] != len(self.mean):
            raise ValueError(f"StepInput: the batch has {images.shape[3]} channels, mean and "
                             f"std {len(self.mean)}")
        if self.device is not None:
            images = images.to(self.device, non_blocking=images.is_pinned())
        tensor = images.permute(0, 3, 1, 2)  # NCHW shape over NHWC memory: channels_last
        if self.dtype != "uint8":
            shape = (1, len(self.mean), 1, 1)
            mean = torch.tensor(self.mean, dtype=torch.float32, device=tensor.device)
            std = torch.tensor(self.std, dtype=torch.float32, device=tensor.device)
            tensor = ((tensor.float() - mean.view(shape)) / std.view(shape)).to(
                getattr(torch, self.dtype), memory_format=torch.channels_last)
        if self.layout == "nchw":
            tensor = tensor.contiguous()
        return tensor
