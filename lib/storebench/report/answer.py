"""The README's answer: a few situations, each answered by ``storebench advise`` from one
results directory, against the common default (torch's DataLoader over one file per
sample, what an ImageFolder reads).

The situations are data (``ANSWER_SITUATIONS``); which format and loader each row names,
and how sure it is, come from the decision guide's rows (``storebench.guide``). Nothing
here names a winner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..results import DECISION_MARGIN, Results
from ..text import ENCODING_NAMES, format_ratio, markdown_table
from .advise import (
    FIT_FRACTION,
    AdviceError,
    Choice,
    Situation,
    advise,
    get_workload,
    recipe_versus_default,
    sample_bytes,
)

# The node every row is answered for: a common single-accelerator training node.
NODE_RAM_GB = 64
NODE_CORES = 16
WORKLOAD = "mlperf-resnet50-h100"


@dataclass(frozen=True)
class AnswerSituation:
    """One row's situation: the image kind, where the data lives (``rtt_ms`` for object
    storage) and how many times the node's RAM the set is (below ``FIT_FRACTION``: fits)."""

    images: str
    storage: str = "local"
    rtt_ms: float | None = None
    ram_ratio: float = 0.25

    @property
    def text(self) -> str:
        if self.storage != "local":
            return f"{ENCODING_NAMES[self.images]}, object storage {self.rtt_ms:g} ms away"
        size = ("fits in RAM" if self.ram_ratio <= FIT_FRACTION
                else f"{self.ram_ratio:g}\u00d7 the RAM")
        return f"{ENCODING_NAMES[self.images]}, local disk, {size}"


ANSWER_SITUATIONS: tuple[AnswerSituation, ...] = (
    AnswerSituation("jpeg"),
    AnswerSituation("jpeg", ram_ratio=5),
    AnswerSituation("jpeg", storage="s3", rtt_ms=20),
    AnswerSituation("png"),
    AnswerSituation("raw"),
    AnswerSituation("raw", ram_ratio=5),
)
MAX_ANSWER_ROWS = 8

# Where the docs pages lie, relative to the README (the docs' own pages link from "").
DOCS = "docs/"


def situation_for(row: AnswerSituation, results: Results) -> Situation:
    """``row`` at the reference set's own sample size, on the answer's node."""
    mean_bytes = sample_bytes(results, row.images)
    count = max(1, round(row.ram_ratio * NODE_RAM_GB * 1e9 / mean_bytes))
    workload = get_workload(WORKLOAD)
    return Situation(images=row.images, count=count, mean_bytes=mean_bytes,
                     storage=row.storage, rtt_ms=row.rtt_ms, ram_gb=NODE_RAM_GB,
                     cores=NODE_CORES, demand=workload.samples_per_s, workload=WORKLOAD)


def short_choice(choice: Choice) -> str:
    """The choice in a table cell: equivalent choices collapse to "any of", an undecided
    one names the two it could not split."""
    if choice.tied:
        return "any of " + ", ".join((choice.label, *choice.tied))
    if choice.undecided and choice.runner_up:
        return f"{choice.label} or {choice.runner_up}"
    return choice.label


def load_sureness(advice) -> str:
    """How sure the loader is: outside RAM, the one path the store was timed with, chosen
    with it rather than against others."""
    if advice.loader.study != advice.store.study and advice.loader.runner_up is None:
        return "as timed with the store"
    return sureness(advice.loader)


def sureness(choice: Choice) -> str:
    if choice.tied:
        return f"equivalent within {DECISION_MARGIN:.0%}"
    if choice.undecided:
        return "undecided"
    return "better"


def default_effect(results: Results, images: str) -> str:
    """The in-RAM answer's recipe against the tuned DataLoader recipe, both from the one
    guide row the answer is read from (``recipe_versus_default``), with the verdict of the
    decision rule."""
    found = recipe_versus_default(results, images)
    if found is None:
        return "not measured"
    row, default, (ratio, low, high, verdict) = found
    if default is row.best:
        return "1× (the answer is the DataLoader)"
    interval = (f"95% interval {format_ratio(low)}\u2013{format_ratio(high)}"
                if math.isfinite(low) else f"n = {row.best.stat.count} and "
                                           f"{default.stat.count}")
    word = {"better": "faster", "equivalent": f"equivalent within {DECISION_MARGIN:.0%}",
            "undecided": "undecided"}[verdict]
    return f"{format_ratio(ratio)} ({word}; {interval})"


def answer_rows(results: Results, *, docs: str = DOCS) -> pd.DataFrame:
    """One row per ``ANSWER_SITUATIONS`` entry: store as, load with, the effect against the
    default, whether one accelerator of the workload is kept busy, how sure, the evidence."""
    workload = get_workload(WORKLOAD)
    out = []
    measured = set(results.df["encoding"].dropna())
    for row in ANSWER_SITUATIONS:
        base = {"your situation": row.text}
        if row.images not in measured:
            # A run on sets without this kind of sample (the ImageNet-like set has no PNG).
            kinds = ", ".join(ENCODING_NAMES[e] for e in ENCODING_NAMES if e in measured)
            out.append({**base, "store as": f"not measured: no study of these results read "
                                            f"{ENCODING_NAMES[row.images]} (they read "
                                            f"{kinds})", "load with": "",
                        "vs torch DataLoader over files": "", "busy": "", "how sure": "",
                        "evidence": ""})
            continue
        try:
            advice = advise(situation_for(row, results), results)
        except (AdviceError, LookupError) as err:
            out.append({**base, "store as": f"not answered: {err}", "load with": "",
                        "vs torch DataLoader over files": "", "busy": "", "how sure": "",
                        "evidence": ""})
            continue
        load = short_choice(advice.loader)
        if advice.decoder is not None:
            load += f", {advice.decoder.label} decode"
        studies = dict.fromkeys((advice.store.study, advice.loader.study))
        out.append({
            **base,
            "store as": short_choice(advice.store),
            "load with": f"{load}, {advice.parallelism_text}",
            # The DataLoader recipe was timed over cached sets: in RAM only.
            "vs torch DataLoader over files": (
                default_effect(results, row.images)
                if row.storage == "local" and row.ram_ratio <= FIT_FRACTION
                else "not measured (the DataLoader recipe was timed over sets in RAM)"),
            # "yes" needs the headroom the GPU evidence covers: the feed over the demand.
            "busy": f"{advice.busy} (the feed {format_ratio(advice.headroom)} the demand)",
            "how sure": (f"recipe: {sureness(advice.loader)}"
                         if advice.store.key == advice.loader.key else
                         f"store: {sureness(advice.store)}; load: {load_sureness(advice)}"),
            "evidence": ", ".join(f"[{s}]({docs}studies/{s}.md)" for s in studies),
        })
    table = pd.DataFrame(out)
    return table.rename(columns={
        "busy": f"one accelerator at {workload.samples_per_s:,.0f} samples/s busy on "
                f"{NODE_CORES} cores?"})


def answer_markdown(results: Results, *, docs: str = DOCS) -> str:
    """The answer table and the line saying what it assumes; ``docs``: where the docs pages
    lie relative to the page it goes in."""
    workload = get_workload(WORKLOAD)
    table = answer_rows(results, docs=docs)
    measured = results.workload("peers")
    peers_set = f" (measured on {measured})" if measured else ""
    return (markdown_table(table) + "\n\nEach row is `storebench advise` for that situation on "
            f"a node of {NODE_RAM_GB} GB RAM, {NODE_CORES} cores and one accelerator running "
            f"{workload.name} ({workload.samples_per_s:,.0f} samples/s), at the measured "
            "set's sample size. In RAM, a row names one recipe (layout, reader, decoder, "
            "training crop and loader) timed end to end over the cached set, warm, epochs 2 "
            f"and on, in the peers study{peers_set}; \"vs torch DataLoader over files\" is "
            "that recipe over the tuned DataLoader recipe (torch's DataLoader over one file "
            "per sample, as an ImageFolder reads, decoding and cropping with Pillow) in the "
            "same rows. Larger than RAM and in object storage, the situation's study timed "
            "each store through one loader path, and the row names that path. "
            "\"undecided\": the rows could not split the two named under the decision rule "
            f"([methodology]({docs}methodology.md)).")
