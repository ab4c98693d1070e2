"""The gpu_decode study: how many CPU cores does one accelerator need to stay busy on JPEG
training data, and when does decoding on the accelerator pay?

Over an ImageNet-like JPEG set (``cases.decode_spec``: 375x500 images), three families of
cases (``cases``):

- decode on the device, with the standard random-resized crop to 224 and flip there: DALI
  ``decoders.image(device="mixed")`` at each ``HW_DECODER_LOADS``, nvImageCodec's batch
  decode and ``torchvision.io.decode_jpeg(device="cuda")``: images/s, CPU cores busy, device
  memory, and the check against each library's CPU fallback;
- the demand: ResNet-50 training steps (bf16 autocast, channels_last, batch 256, synthetic
  labels) on data already on the device;
- the cores curve: simplejpeg, whole images and reduced-size (DCT-scaled) decode, through
  our prefetchers with 1, 2, 4, 8 and all cores: delivered samples/s, and the accelerator
  utilisation (AU) a consumer at the model's rate gets from them.

Without a device, the device and model cases are ``skipped`` rows saying why, and the
cores curve feeds an emulated accelerator at ``EMULATED_DEMAND`` (MLPerf Storage's ResNet-50
rate per emulated H100). On a GPU machine ``python -m storebench.gpu_study``
(``make gpu-study``) measures the model first and lays out the cores curve at its rate.

Its grid is ``grid``, its tables, figures and findings ``report``, its guide rows
``guide``, its case functions ``cases``; this module ties them into ``STUDY``.
"""

from __future__ import annotations

from ..base import LiveComparison, Study
from .grid import NAME, grid, prepare
from .guide import guide
from .report import FIGURES, findings

# The live cell: JPEG decode on the CPU feeding the accelerator, two workers against one.
LIVE = LiveComparison(
    pair=("2 workers", "1 worker"),
    choices={f"{n} worker{'s' if n > 1 else ''}": {"function": "cpu_decode_feed", "workers": n,
                                                  "param_decode": "full"}
             for n in (1, 2)},
    formats=("lmdb",), encodings=("jpeg",), metric="fed_samples_per_s",
)


STUDY = Study(
    name=NAME,
    question="How many CPU cores does one accelerator need on JPEGs, and when does GPU "
             "decode pay?",
    grid=grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="09_gpu_decode.ipynb",
    # It reads its own ImageNet-like set, never a user's import (``study --dataset``).
    synthetic_only=True,
    prepare=prepare,
    live=LIVE,
)
