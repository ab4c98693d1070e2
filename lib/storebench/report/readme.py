"""The README's findings block, generated from a results directory (never typed by hand)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .cold import cold_block
from .examples import EXAMPLES_PAGE, render_examples_page
from .recipes import RECIPES_PAGE, render_recipes_page

START, END = "<!-- findings:start -->", "<!-- findings:end -->"
COMMANDS_START, COMMANDS_END = "<!-- commands:start -->", "<!-- commands:end -->"
# The methodology page's block on cold reads under a virtual machine (``report.cold``).
COLD_START, COLD_END = "<!-- cold:start -->", "<!-- cold:end -->"
# A study page's generated block (``Study.page_text``), in ``STUDY_PAGES/<name>.md``.
STUDY_START, STUDY_END = "<!-- study:start -->", "<!-- study:end -->"
STUDY_PAGES = "docs/studies"
# Committed runs of ``make quick``, one directory per run id, relative to the README.
QUICK_RUNS = "results/quick-runs"


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



def render_findings_block(results_dir: Path | str, *, relative_to: Path | None = None) -> str:
    """The machine line, the answer table, the study time, then what each study with rows
    shows in the README (its text, then its figures), in the studies' run order, as
    markdown. The full decision guide is ``render_guide_page``'s."""
    from ..results import Results
    from ..studies import STUDIES
    from ..studies.base import ReadmePlace
    from .answer import answer_markdown
    from .figures import readme_figures, study_figures
    from .guide import decision_guide
    from .targets import readme_text as every_target_text

    results_dir = Path(results_dir)
    place = ReadmePlace(results_dir=results_dir,
                        base=relative_to or results_dir.resolve().parents[1])
    results = Results.load(results_dir)
    rows = decision_guide(results)
    parts = [machine_line(results), "", answer_markdown(results), "",
             f"Every question the studies answer, {len(rows)} in all, with each candidate's "
             f"evidence: [the decision guide]({GUIDE_PAGE})."]
    timing_text = study_time_text(results_dir, place.base)
    if timing_text:
        parts += ["", timing_text]
    later = later_runs_text(results)
    if later:
        parts += ["", later]
    present = set(results.df["study"])
    studies = [study for study in STUDIES.values() if study.name in present]
    for study in studies:
        texts = [study.readme_text(results, place) if study.readme_text else "",
                 every_target_text(results, place) if study.shows_every_target else ""]
        parts += [part for text in texts if text for part in ("", text.rstrip("\n"))]
    for study in studies:
        captions = {spec.name: spec.caption for spec in study_figures(study)}
        for stem in readme_figures(study):
            png = results_dir / "figures" / f"{stem}.png"
            if png.exists():
                parts += ["", f"![{captions[stem]}]({place.relative(png)})"]
    return "\n".join(parts) + "\n"


def later_runs_text(results) -> str:
    """Which studies' rows come from another run than ``env.json``'s, with that run's
    machine limits: their rates are compared within their study only."""
    from ..results import latest_runs

    main_run = str(results.env.get("run_id", ""))
    later: dict[str, list[str]] = {}
    for study in dict.fromkeys(results.df["study"]):
        rows = latest_runs(results.study(study))
        run = str(rows["run_id"].iloc[-1]) if not rows.empty else main_run
        if run != main_run:
            later.setdefault(run, []).append(study)
    if not later:
        return ""
    parts = []
    for studies in later.values():
        env = results.study_env(studies[0])
        limits = env.get("limits") or {}
        copy = limits.get("dram_copy_GBps")
        parts.append(f"{', '.join(studies)}" + (f" (DRAM copy {copy:.1f} GB/s)" if copy else ""))
    main_copy = (results.env.get("limits") or {}).get("dram_copy_GBps")
    # The reader needs which rows share a machine's run, not the runs' ids: the
    # ``env-<run>.json`` files beside the rows name them.
    return ("Some studies' rows come from later runs on the same machine kind, each run "
            "described by its own `env-<run>.json` beside the rows: " + "; ".join(parts)
            + ". The machine line above is the first run's"
            + (f" (DRAM copy {main_copy:.1f} GB/s)" if main_copy else "")
            + ". Rates are compared within a study's own run, never across runs.")


# The generated decision guide, relative to the README.
GUIDE_PAGE = "docs/guide.md"


def machine_line(results) -> str:
    from ..text import machine_text

    return (f"Measured on: {machine_text(results.env)}." if results.env
            else "Machine unknown (no env.json).")


def render_guide_page(results_dir: Path | str) -> str:
    """The decision guide's block for ``docs/guide.md``: the machine, every question with
    its choice and evidence, and the tie rule."""
    from .findings import readme_findings_table

    return readme_findings_table(results_dir)


# The methodology page, whose machine-calibration section is generated, relative to the README.
METHODOLOGY_PAGE = "docs/methodology.md"
# The docs' home page, which opens with the answer table.
HOME_PAGE = "docs/index.md"


def render_home_block(results_dir: Path | str) -> str:
    """The docs home page's block: the machine line, the answer table with links relative
    to the docs, and where the whole guide is."""
    from ..results import Results
    from .answer import answer_markdown

    results = Results.load(results_dir)
    return (machine_line(results) + "\n\n" + answer_markdown(results, docs="") + "\n\n"
            "Every question the studies answer, with each candidate's evidence: "
            "[the decision guide](guide.md).\n")


def render_calibration_block(results_dir: Path | str) -> str:
    """The methodology page's machine-calibration block: the machine line, then the
    targets measured on small synthetic sets (``TargetSpec.calibration``)."""
    from ..results import Results
    from .targets import targets_markdown

    results = Results.load(results_dir)
    return (machine_line(results) + "\n\n" + targets_markdown(results, calibration=True)
            + "\n")


def _minutes(timing_path: Path, base: Path) -> str:
    """``"12.3 min (`results/…/timing.json`)"``, or "" where the file is missing."""
    if not timing_path.exists():
        return ""
    seconds = json.loads(timing_path.read_text())["total_seconds"]
    return (f"{seconds / 60:.1f} min "
            f"(`{timing_path.resolve().relative_to(base.resolve()).as_posix()}`)")


def render_commands_block(results_dir: Path | str, base: Path) -> str:
    """The README's commands, each with how long it took on the machine of its timing
    file: ``make quick`` from the latest committed quick run, ``make study`` from
    ``results_dir``'s ``timing.json``."""
    runs = sorted(p for p in (base / QUICK_RUNS).glob("*/timing.json"))
    quick = _minutes(runs[-1], base) if runs else ""
    study = _minutes(Path(results_dir) / "timing.json", base)
    lines = [
        "make quick   # the answer table for this machine: measures only the cases the",
        "             # reference's answer rests on (each decision's two best candidates)",
        f"             # into results/quick/; took {quick}" if quick else
        "             # into results/quick/",
        "make study   # creates .venv and .venv-peers, installs, builds the default (small)",
        "             # profile, runs every study, regenerates the figures and executes the",
        f"             # notebooks into results/small/; took {study}" if study else
        "             # notebooks into results/small/",
        "make test    # creates them if missing, runs ruff and the whole test suite (which",
        "             # also runs the ci-profile study end to end and executes every",
        "             # notebook), then the tests marked `peers` with the peers environment",
    ]
    return "```bash\n" + "\n".join(lines) + "\n```\n"


def _fill(path: Path, block: str, start: str = START, end: str = END) -> bool:
    """Rewrite the block between the ``start`` and ``end`` markers of ``path`` (the
    findings block's by default); True when it changed."""
    text = path.read_text()
    if start not in text or end not in text:
        raise ValueError(f"{path}: no {start} ... {end} block to fill")
    new = re.sub(re.escape(start) + r"\n.*?" + re.escape(end),
                 lambda _: f"{start}\n{block}{end}", text, flags=re.S)
    if new != text:
        path.write_text(new)
    return new != text


def render_study_page_block(results_dir: Path | str, name: str) -> str:
    """Study ``name``'s docs page block (``Study.page_text``) from ``results_dir``."""
    from ..results import Results
    from ..studies import STUDIES

    return STUDIES[name].page_text(Results.load(results_dir))


def _fill_study_pages(base: Path, results_dir: Path | str) -> bool:
    """Fill the generated block of every study page whose study writes one."""
    from ..studies import STUDIES

    changed = False
    for name, study in STUDIES.items():
        page = base / STUDY_PAGES / f"{name}.md"
        if study.page_text is not None and page.exists():
            changed = _fill(page, render_study_page_block(results_dir, name), STUDY_START,
                            STUDY_END) or changed
    return changed


def update_readme(readme: Path | str, results_dir: Path | str) -> bool:
    """Rewrite the README's findings block, and those of the docs' home page, the guide
    page, the methodology page and the advise examples page beside it (``HOME_PAGE``,
    ``GUIDE_PAGE``, ``METHODOLOGY_PAGE``, ``EXAMPLES_PAGE``); True when any changed."""
    readme = Path(readme)
    block = render_findings_block(results_dir, relative_to=readme.resolve().parent)
    changed = _fill(readme, block)
    changed = _fill(readme, render_commands_block(results_dir, readme.resolve().parent),
                    COMMANDS_START, COMMANDS_END) or changed
    guide = readme.resolve().parent / GUIDE_PAGE
    if guide.exists():
        changed = _fill(guide, render_guide_page(results_dir)) or changed
    home = readme.resolve().parent / HOME_PAGE
    if home.exists():
        changed = _fill(home, render_home_block(results_dir)) or changed
    recipes = readme.resolve().parent / RECIPES_PAGE
    if recipes.exists():
        changed = _fill(recipes, render_recipes_page()) or changed
    methodology = readme.resolve().parent / METHODOLOGY_PAGE
    if methodology.exists():
        changed = _fill(methodology, render_calibration_block(results_dir)) or changed
        changed = _fill(methodology, cold_block(results_dir), COLD_START, COLD_END) or changed
    changed = _fill_study_pages(readme.resolve().parent, results_dir) or changed
    examples = readme.resolve().parent / EXAMPLES_PAGE
    if examples.exists():
        changed = _fill(examples, render_examples_page(
            results_dir, relative_to=readme.resolve().parent)) or changed
    return changed
