"""DALI's CPU pipeline runs the gpu_decode study's graph (``dali_crop_graph``): the one the
mixed pipeline runs on a GPU, with ``decoders.image(device="cpu")``. Its crops are our
decode's pixels, its random crops ours within the stated tolerance."""

from __future__ import annotations

import numpy as np
import pytest

import data_gen
from storebench.loaders.device import (
    CROP_SIZE,
    CropPlan,
    DaliDecoder,
    crop_plan,
    decode_crop_reference,
)
from storebench.studies.gpu_decode.cases import (
    DECODE_HEIGHT,
    DECODE_WIDTH,
    FALLBACK_TOLERANCE_LEVELS,
)

pytestmark = [pytest.mark.peers, pytest.mark.timeout(120)]
dali = pytest.importorskip("nvidia.dali")
simplejpeg = pytest.importorskip("simplejpeg")

SPEC = data_gen.DatasetSpec(8, DECODE_HEIGHT, DECODE_WIDTH, encoding="jpeg", seed=5)


@pytest.fixture(scope="module")
def encoded() -> list[bytes]:
    return [data_gen.sample(SPEC, i)[0] for i in range(SPEC.num_samples)]


@pytest.fixture(scope="module")
def decoder():
    decoder = DaliDecoder(None, batch_size=SPEC.num_samples, hw_decoder_load=0.5, threads=1)
    yield decoder
    decoder.close()


def test_boxes_of_the_output_size_are_our_decodes_pixels_mirrored_where_flipped(encoded,
                                                                                decoder):
    boxes = [(k * 10, k * 30, CROP_SIZE, CROP_SIZE) for k in range(SPEC.num_samples)]
    flips = [k % 2 == 1 for k in range(SPEC.num_samples)]
    plan = CropPlan(np.array(boxes, dtype=np.int64), np.array(flips))
    out = decoder.to_host(decoder.run(encoded, plan))
    assert out.shape == (SPEC.num_samples, CROP_SIZE, CROP_SIZE, 3) and out.dtype == np.uint8
    for k, (y, x, h, w) in enumerate(boxes):
        ours = simplejpeg.decode_jpeg(encoded[k], colorspace="RGB")[y:y + h, x:x + w]
        ours = ours[:, ::-1] if flips[k] else ours
        diff = np.abs(out[k].astype(int) - ours.astype(int))
        assert diff.mean() <= FALLBACK_TOLERANCE_LEVELS, (k, diff.mean())


def test_random_resized_crops_match_our_cpu_path_within_the_tolerance(encoded, decoder):
    for batch in range(3):
        plan = crop_plan([(DECODE_HEIGHT, DECODE_WIDTH)] * SPEC.num_samples, seed=0,
                         batch=batch)
        out = decoder.to_host(decoder.run(encoded, plan))
        ours = decode_crop_reference(encoded, plan)
        diff = np.abs(out.astype(int) - ours.astype(int))
        assert diff.mean() <= FALLBACK_TOLERANCE_LEVELS, (batch, diff.mean(), diff.max())


def test_a_smaller_batch_than_the_pipelines_runs_too(encoded, decoder):
    plan = crop_plan([(DECODE_HEIGHT, DECODE_WIDTH)] * 3, seed=1, batch=0)
    assert decoder.to_host(decoder.run(encoded[:3], plan)).shape == (3, CROP_SIZE, CROP_SIZE, 3)
