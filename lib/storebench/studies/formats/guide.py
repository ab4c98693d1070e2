"""The formats study's guide rows: least disk space, fastest build, fewest files and the
fastest guest-cold sequential read."""

from __future__ import annotations

from ...results import Results, dataset_names, default_builds, format_order, ordered, select, stat
from ...text import ENCODING_NAMES, ENCODING_ORDER
from ..captions import question_caption
from .report import allocated_per_sample, dataset_stat


def guide(results: Results) -> list:
    """Least disk space (lossless, lossy), fastest build, fewest files, and the fastest
    cold sequential read per encoding: every measured build is a candidate."""
    from ...guide import Candidate, choose

    df = results.study("formats")
    rows = []
    sized = select(df, "size_ratio").assign(dataset=lambda d: dataset_names(d))
    for question, encodings in (
            ("Least disk space per sample, allocated, lossless (raw or PNG samples)",
             ("raw", "png")),
            ("Least disk space per sample, allocated, lossy JPEG accepted", ("jpeg",))):
        part = sized[sized["encoding"].isin(encodings)]
        candidates = [Candidate(name, name, allocated_per_sample(df, name))
                      for name in dict.fromkeys(part["dataset"])]
        rows.append(choose("formats", question, "bytes_allocated_per_sample", candidates,
                           lower_is_better=True))
    defaults = default_builds(df)
    # Every measured build is a candidate, knob variants included: a variant that builds
    # faster or in fewer files is an answer too.
    builds = select(df, "write_seconds").assign(dataset=lambda d: dataset_names(d))
    for question, metric, encoding in (
            ("Fastest to build, raw arrays", "write_seconds", "raw"),
            ("Fewest files, raw arrays (shared or object storage, many-file limits)",
             "file_count", "raw")):
        names = dict.fromkeys(builds.loc[builds["encoding"] == encoding, "dataset"])
        candidates = [Candidate(name, name, dataset_stat(df, name, metric))
                      for name in names]
        rows.append(choose("formats", question, metric, candidates, lower_is_better=True))
    for encoding in ordered(defaults["encoding"], ENCODING_ORDER):
        part = select(defaults, "samples_per_s", encoding=encoding, loader="reader",
                      access="sequential", cache="cold")
        candidates = [Candidate(fmt, fmt, stat(part, "samples_per_s", format=fmt))
                      for fmt in ordered(part["format"], format_order())]
        rows.append(choose(
            "formats", f"Reading every sample once from a guest-cold cache, undecoded, "
            f"{ENCODING_NAMES.get(encoding, encoding)}"
            f"{question_caption(results, 'formats', part, encoding)}",
            "samples_per_s", candidates, facets={"encoding": encoding}))
    return [row for row in rows if row is not None]
