"""The prefetch study's guide rows: the fastest loader path per dataset and decoder, and the
quickest to its first batch."""

from __future__ import annotations

import pandas as pd

from ...results import Results, select, stat
from ...text import ENCODING_NAMES
from ..captions import question_caption
from .report import prefetch_rows, transformed

# Start-up, from a fresh loader: its own guide question (``first_batch_guide``).
FIRST_BATCH = "time_to_first_batch_s"


def decoder_name(decode: str) -> str:
    """A decoder as a question names it."""
    return {"reduced": "reduced-size (DCT-scaled) simplejpeg",
            "window": "crop-window (libjpeg-turbo)"}.get(decode, decode)


def guide(results: Results) -> list:
    """Per dataset and decoder of the study: every loader path measured is a candidate
    (one thread, ours, the frameworks', the baselines; tf.data's native pipeline joins the
    JPEG question, decoding with TensorFlow)."""
    from ...guide import Candidate, choose

    rows = prefetch_rows(results.df)
    picked = select(rows, "samples_per_s")
    if picked.empty:
        return []
    cores = results.env.get("cpus_usable") or results.env.get("cpu_count") or "?"
    out = []
    native = picked[picked["prefetcher"] == "tf_data"]
    for (dataset, decode), part in picked[picked["prefetcher"] != "tf_data"].groupby(
            ["dataset", "decode"], sort=False):
        encoding = part["encoding"].iloc[0]
        crop = " through the training crop" if transformed(part) else ""
        if decode == "none":
            question = (f"Decoded raw arrays{crop} from a cached {dataset}, one training "
                        f"process, {cores} cores: which loader path?")
        else:
            question = (f"{ENCODING_NAMES.get(encoding, encoding)} decoded with "
                        f"{decoder_name(decode)}"
                        f"{crop} from a cached {dataset}, one training process, {cores} "
                        "cores: which loader path?")
        # A process path's start method is named: fork and spawn differ by tens of percent,
        # and a row measured under fork alone must not read as the path's answer.
        candidates = [Candidate(key, label + (f" ({method})" if method and method not in label
                                              else ""),
                                stat(part, "samples_per_s", path=key))
                      for key, label, method in dict.fromkeys(
                          zip(part["path"], part["label"], part["start_method"]))]
        if decode in ("simplejpeg", "auto"):  # what tf.data's own decoder competes with
            candidates += [Candidate(key, f"{label} over {d}",
                                     stat(native, "samples_per_s", path=key))
                           for key, label, d in dict.fromkeys(
                               zip(native["path"], native["label"], native["dataset"]))]
        out.append(choose("prefetch",
                          f"{question}{question_caption(results, 'prefetch', part, encoding)}",
                          "samples_per_s", candidates,
                          facets={"encoding": encoding, "decode": decode, "dataset": dataset}))
    return [row for row in out if row is not None] + first_batch_guide(results, rows, cores)


def first_batch_guide(results: Results, rows: pd.DataFrame, cores) -> list:
    """Start-up as its own question, never mixed into a throughput: per dataset and
    decoder, the loader path fastest to its first batch from a fresh loader (workers
    started, ``time_to_first_batch_s``)."""
    from ...guide import Candidate, choose

    picked = select(rows, FIRST_BATCH)
    native = picked[picked["prefetcher"] == "tf_data"]
    out = []
    for (dataset, decode), part in picked[picked["prefetcher"] != "tf_data"].groupby(
            ["dataset", "decode"], sort=False):
        encoding = part["encoding"].iloc[0]
        crop = " through the training crop" if transformed(part) else ""
        what = (f"decoded raw arrays{crop}" if decode == "none" else
                f"{ENCODING_NAMES.get(encoding, encoding)} decoded with "
                f"{decoder_name(decode)}{crop}")
        both = pd.concat([part, native]) if decode in ("simplejpeg", "auto") else part
        # Start-up above all differs by start method: each process path names its own.
        candidates = [Candidate(key, label + (f" ({method})" if method and method not in label
                                              else "") + ("" if d == dataset else f" over {d}"),
                                stat(both, FIRST_BATCH, path=key))
                      for key, label, method, d in dict.fromkeys(zip(
                          both["path"], both["label"], both["start_method"], both["dataset"]))]
        out.append(choose(
            "prefetch", f"Fastest to first batch: {what} from a cached {dataset}, a fresh "
            f"loader (workers started), {cores} cores: which loader path?"
            f"{question_caption(results, 'prefetch', part, encoding)}", FIRST_BATCH, candidates,
            lower_is_better=True, facets={"question": "first_batch", "encoding": encoding,
                                          "decode": decode, "dataset": dataset}))
    return [row for row in out if row is not None]
