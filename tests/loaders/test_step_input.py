"""StepInput: a loader's uint8 (B, H, W, C) batch as the tensor a training step takes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storebench.loaders import AcceleratorUnavailableError, StepInput
from storebench.loaders.step_input import IMAGENET_MEAN, IMAGENET_STD


def batch(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (4, 6, 5, 3), dtype=np.uint8)


def test_uint8_channels_last_views_the_batch_without_a_copy():
    images = batch()
    tensor = StepInput()(images)
    assert tensor.shape == (4, 3, 6, 5) and tensor.dtype == torch.uint8
    assert tensor.is_contiguous(memory_format=torch.channels_last)
    assert tensor.data_ptr() == images.ctypes.data  # the loader's own memory
    np.testing.assert_array_equal(tensor.numpy(), images.transpose(0, 3, 1, 2))


def test_nchw_is_a_contiguous_copy():
    images = batch()
    tensor = StepInput(layout="nchw")(images)
    assert tensor.is_contiguous() and tensor.data_ptr() != images.ctypes.data
    np.testing.assert_array_equal(tensor.numpy(), images.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-6), ("float16", 2e-3),
                                              ("bfloat16", 2e-2)])
@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
def test_float_outputs_are_normalised_per_channel(dtype, tolerance, layout):
    images = batch(1)
    tensor = StepInput(layout=layout, dtype=dtype)(images)
    assert tensor.dtype == getattr(torch, dtype) and tensor.shape == (4, 3, 6, 5)
    assert tensor.is_contiguous(memory_format=torch.channels_last if layout == "channels_last"
                                else torch.contiguous_format)
    want = (images.astype(np.float64) - IMAGENET_MEAN) / IMAGENET_STD
    got = tensor.float().numpy().transpose(0, 2, 3, 1)
    assert np.abs(got - want).max() <= tolerance * max(1.0, np.abs(want).max())


def test_a_torch_batch_is_taken_too_and_bad_batches_are_refused():
    images = torch.from_numpy(batch())
    assert torch.equal(StepInput()(images), images.permute(0, 3, 1, 2))
    with pytest.raises(ValueError, match=r"StepInput takes uint8 \(B, H, W, C\) batches, got "
                                         r"float32 \(4, 6, 5, 3\)"):
        StepInput()(batch().astype(np.float32))
    with pytest.raises(ValueError, match="the batch has 1 channels, mean and std 3"):
        StepInput(dtype="float16")(batch()[..., :1])
    with pytest.raises(ValueError, match="layout must be one of"):
        StepInput(layout="nhwc")
    with pytest.raises(ValueError, match="dtype must be one of"):
        StepInput(dtype="int8")
    with pytest.raises(ValueError, match="one value per channel, std > 0"):
        StepInput(std=(1.0, 0.0, 1.0))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_a_device_is_refused_at_once_without_cuda():
    with pytest.raises(AcceleratorUnavailableError,
                       match=r"StepInput\(device='cuda'\): torch .* reports "
                             r"torch.cuda.is_available\(\) == False"):
        StepInput(device="cuda")
    assert StepInput(device="cpu")(batch()).device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA device: torch.cuda.is_available() is False here")
def test_on_the_device_the_copy_is_uint8_and_normalised_there():
    images = batch(2)
    tensor = StepInput(dtype="bfloat16", device="cuda")(images)
    assert tensor.device.type == "cuda" and tensor.dtype == torch.bfloat16
    host = StepInput(dtype="bfloat16")(images)
    assert torch.equal(tensor.cpu(), host)
