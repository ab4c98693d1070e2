"""The README's findings block, generated from a results directory (never typed by hand)."""

from __future__ import annotations

import json
import re
from pathlib import Path

START, END = "<!-- findings:start -->", "<!-- findings:end -->"
# The figures the README shows, in order; captions come from the studies' FigureSpecs.
KEY_FIGURES = (
    "formats_build_cost",
    "formats_sequential_read",
    "lazy_vs_preloaded_throughput",
    "prefetch_paths",
    "gpu_feed_utilisation",
    "targets_met",
    "peers_rate",
)


def figure_caption(name: str) -> str:
    from .studies import STUDIES

    for study in STUDIES.values():
        for spec in study.figures:
            if spec.name == name:
                return spec.caption
    raise KeyError(f"no study draws a figure named {name!r}")


def study_time_text(results_dir: Path, base: Path) -> str:
    """How long the study took, from its timing files. A study that was stopped and
    resumed has one file per part (``timing-<run id>.json`` for the earlier ones): each part
    is stated with what it ran and reused, never summed into a total it did not take."""
    files = sorted(results_dir.glob("timing-*.json")) + [results_dir / "timing.json"]
    parts = []
    for path in files:
        if not path.exists():
            continue
        timing = json.loads(path.read_text())
        stages = ", ".join(f"{name.removeprefix('study:')} {seconds / 60:.1f}"
                           for name, seconds in timing["stage_seconds"].items()
                           if seconds >= 30)
        ran = sum(timing.get("ran_cases", {}).values())
        reused = sum(timing.get("reused_cases", {}).values())
        failed = sum(len(ids) for ids in timing.get("failed_cases", {}).values())
        failures = (f" ({failed} failed: {', '.join(timing['failed_cases'])} in "
                    "`failed_cases`)" if failed else "")
        rel = path.resolve().relative_to(base.resolve()).as_posix()
        parts.append(f"{timing['total_seconds'] / 60:.1f} min, {ran} cases run{failures} and "
                     f"{reused} reused (minutes by stage: {stages}; `{rel}`)")
    if not parts:
        return ""
    profile = json.loads(files[-1].read_text())["profile"] if files[-1].exists() else ""
    if len(parts) == 1:
        return f"The `{profile}` study took {parts[0]} on this machine."
    return (f"The `{profile}` study ran in {len(parts)} parts on this machine, the later "
            "resuming the earlier (finished cases are reused): " + "; then ".join(parts) + ".")


def peers_target_findings(results) -> list[str]:
    """The peers study's target sentences, where ``results`` hold its rows."""
    from .studies.peers.study import target_findings

    if (results.df["study"] != "peers").all():
        return []
    return target_findings(results)


def cuda_feed_text(cuda_runs_dir: Path, base: Path) -> str:
    """The newest stored feed run on a real CUDA device (``gpu_feed.latest_cuda_run``): its
    machine, findings (AU per compute time is in its figure) and figure, as README markdown;
    empty where there is none."""
    from .findings import machine_text
    from .studies.gpu_feed.study import feed_findings, latest_cuda_run
    from .text import bullets

    run = latest_cuda_run(cuda_runs_dir)
    if run is None:
        return ""
    rel = run.directory.resolve().relative_to(base.resolve()).as_posix()
    parts = [f"**On a real GPU** (the `gpu_feed` study in `{rel}`, run "
             f"{run.env.get('run_id')}; machine: {machine_text(run.env)})", "",
             bullets(feed_findings(run.df, per_compute_time=False)).rstrip("\n")]
    png = run.directory / "figures" / "gpu_feed_utilisation.png"
    if png.exists():
        figure = png.resolve().relative_to(base.resolve()).as_posix()
        parts += ["", f"![{figure_caption('gpu_feed_utilisation')}, on a CUDA device]({figure})"]
    return "\n".join(parts)


def render_findings_block(results_dir: Path | str, *, relative_to: Path | None = None,
                          cuda_runs_dir: Path | str | None = None) -> str:
    """Machine line, decision guide, targets, the cost of verification, the newest feed run
    on a CUDA device (under ``cuda_runs_dir``, default ``gpu-runs`` beside ``results_dir``)
    and key figures, as README markdown."""
    from .findings import readme_findings_table
    from .results import Results
    from .studies.formats.study import verify_cost_findings
    from .studies.targets.study import targets_markdown
    from .text import bullets

    results_dir = Path(results_dir)
    base = relative_to or results_dir.resolve().parents[1]
    parts = [readme_findings_table(results_dir).rstrip("\n")]
    timing_text = study_time_text(results_dir, base)
    if timing_text:
        parts += ["", timing_text]
    parts += ["", "**Performance targets**", ""]
    results = Results.load(results_dir)
    parts.append(targets_markdown(results.df).rstrip("\n"))
    against_peers = peers_target_findings(results)
    if against_peers:
        parts += ["", "**Against the peer libraries** (the `peers` study)", "",
                  bullets(against_peers).rstrip("\n")]
    verify_cost = verify_cost_findings(results.study("formats"))
    if verify_cost:
        parts += ["", "**What `verify=True` costs** (the `formats` study; see "
                  "[Integrity](#integrity-what-each-mode-checks))", "",
                  bullets(verify_cost).rstrip("\n")]
    cuda_text = cuda_feed_text(
        Path(cuda_runs_dir) if cuda_runs_dir is not None else results_dir.parent / "gpu-runs",
        base)
    if cuda_text:
        parts += ["", cuda_text]
    for stem in KEY_FIGURES:
        png = results_dir / "figures" / f"{stem}.png"
        if png.exists():
            rel = png.resolve().relative_to(base.resolve()).as_posix()
            parts += ["", f"![{figure_caption(stem)}]({rel})"]
    return "\n".join(parts) + "\n"


def update_readme(readme: Path | str, results_dir: Path | str) -> bool:
    """Rewrite the block between the findings markers; True when the text changed."""
    readme = Path(readme)
    text = readme.read_text()
    if START not in text or END not in text:
        raise ValueError(f"{readme}: no {START} ... {END} block to fill")
    block = render_findings_block(results_dir, relative_to=readme.resolve().parent)
    new = re.sub(
        re.escape(START) + r"\n.*?" + re.escape(END),
        lambda _: f"{START}\n{block}{END}",
        text,
        flags=re.S,
    )
    if new != text:
        readme.write_text(new)
    return new != text
