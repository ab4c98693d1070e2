"""Worked examples of ``storebench advise``: five situations practitioners ask about,
answered from a results directory for the docs' page (``EXAMPLES_PAGE``), never typed by
hand. A situation the results cannot answer shows advise's one-line refusal, which names
the nearest measured."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# The worked examples' page, relative to the README.
EXAMPLES_PAGE = "docs/advise-examples.md"


@dataclass(frozen=True)
class Example:
    """One situation: a heading and ``storebench advise``'s values (its flags' names with
    ``_`` for ``-``)."""

    title: str
    values: Mapping[str, object]

    def flags(self) -> list[str]:
        return [part for name, value in self.values.items()
                for part in (f"--{name.replace('_', '-')}", f"{value}")]


EXAMPLES = (
    Example("ImageNet on one H100-class accelerator, 16 cores",
            {"images": "jpeg", "count": 1_281_167, "mean_bytes": 110_000, "ram_gb": 64,
             "cores": 16, "accelerators": 1, "workload": "mlperf-resnet50-h100"}),
    Example("14M JPEGs on 4 nodes of 8 accelerators, 96 cores each, on NFS",
            {"images": "jpeg", "count": 14_000_000, "mean_bytes": 110_000, "storage": "nfs",
             "rtt_ms": 1, "ram_gb": 1024, "cores": 96, "accelerators": 8, "nodes": 4,
             "workload": "mlperf-resnet50-h100"}),
    Example("5M JPEGs of 400 kB in object storage 40 ms away, 4 accelerators at 2,500/s",
            {"images": "jpeg", "count": 5_000_000, "mean_bytes": 400_000, "storage": "s3",
             "rtt_ms": 40, "ram_gb": 256, "cores": 32, "accelerators": 4, "demand": 2500}),
    Example("60k small PNGs, one accelerator at 20,000/s",
            {"images": "png", "count": 60_000, "mean_bytes": 20_000, "ram_gb": 64,
             "cores": 16, "accelerators": 1, "demand": 20_000}),
    Example("200k raw arrays of 2 MB on NVMe, 2 accelerators at 500/s",
            {"images": "raw", "count": 200_000, "mean_bytes": 2_000_000, "disk": "nvme",
             "ram_gb": 256,
             "cores": 32, "accelerators": 2, "demand": 500}),
)


def render_examples_page(results_dir: Path | str, *, relative_to: Path) -> str:
    """The examples page's generated block: each situation's command and advise's answer
    (or its one-line refusal) from ``results_dir``."""
    import dataclasses

    from ..results import Results
    from .advise import AdviceError, advise, situation_from

    results_dir = Path(results_dir)
    results = Results.load(results_dir)
    # The page names the results as the command does, relative to the repository.
    shown = results_dir.resolve().relative_to(relative_to.resolve())
    parts = []
    for example in EXAMPLES:
        try:
            answered = advise(situation_from(**example.values), results)
            # The page names the results directory; its rows name their runs.
            answer = dataclasses.replace(answered, results_dir=str(shown), run_id="").text()
        except AdviceError as refused:
            answer = f"storebench advise: {str(refused).replace(str(results_dir), str(shown))}"
        command = shlex.join(["storebench", "advise", *example.flags(), "--results",
                              str(shown)])
        parts.append(f"## {example.title}\n\n```bash\n{command}\n```\n\n```text\n{answer}\n"
                     "```\n")
    return "\n".join(parts)
