"""The resume study's grid: every resumable path in each scenario, killed and restored from its
last checkpoint, and the sets it reads (``prepare``)."""

from __future__ import annotations

from pathlib import Path

from ...bench.case import Case
from ...bench.plan import peer_sets_dir, plan_for
from .cases import RESUME_PATHS, SCENARIOS, WORKERS, get_resume_path

NAME = "resume"
CASES = "storebench.studies.resume.cases"
# (batch size, checkpoint every n batches): ci's raw set is 256 samples (16 batches), the
# default profile's cut set 2,048 (32 batches).
COMPACT_KNOBS = (16, 2)
FULL_KNOBS = (64, 4)
# Kills per epoch: two (one mid-batch) where a training process starts in a second; one,
# seeded mid-batch or not, where each start imports a peer library or TensorFlow (seconds
# each), so that the default profile's study stays within about three minutes.
KILLS = {"ours": 2}
OTHER_KILLS = 1
# ci: one of each kind of case, without tf.data, whose every training process imports
# TensorFlow (tens of seconds here; tests/loaders/test_tf_resume.py kills and restores it).
COMPACT = (("process_fork", "same_workers"), ("thread", "workers_changed"),
           ("process_fork", "ranks_3_to_2"), ("torchdata", "same_workers"),
           ("webdataset", "same_workers"))


def _pairs(compact: bool) -> list[tuple[str, str]]:
    if compact:
        return list(COMPACT)
    out = []
    for name, path in RESUME_PATHS.items():
        # A path that claims nothing gets one row: its reason holds for every scenario.
        out += [(name, "same_workers")] if path.unsupported else [(name, s) for s in SCENARIOS]
    return out


def resume_grid(*, profile: str, data_dir: Path | str, repeats: int | None = None
                ) -> list[Case]:
    """Every path x scenario (``COMPACT`` on ci): one case each, one epoch killed and
    resumed; ``repeats`` (the CLI's ``--repeats``) runs that many epochs, each killed at
    points of its own. The plan's repeats do not apply: a case's kills are its
    repetitions, and its outcome is counted, not timed."""
    plan = plan_for(profile)
    batch, every = COMPACT_KNOBS if plan.compact else FULL_KNOBS
    sets = peer_sets_dir(data_dir)
    cases = []
    for name, scenario in _pairs(plan.compact):
        path = get_resume_path(name)
        params = {"path": name, "scenario": scenario, "every": every,
                  "kills": KILLS.get(path.kind, OTHER_KILLS)}
        if path.environment:
            params["environment"] = path.environment
        if path.start_method:
            params["start_method"] = path.start_method
        cases.append(Case(study=NAME, function=f"{CASES}:resume_case", format=path.format,
                          encoding="raw", dataset=str(sets / f"{path.format}-raw"),
                          prefetcher=path.loader, workers=WORKERS, batch_size=batch,
                          access="shuffle", repeats=repeats or 1, warmup=False,
                          timeout_s=plan.timeout_s, params=params))
    return cases


def prepare(*, profile: str, data_dir: Path | str, progress: bool = True) -> None:
    """Build the sets the study reads (``peer_specs``): ours and tf.data's (memmap,
    TFRecord) with this interpreter, the peers' own formats in the peers environment
    (where it is missing, their rows say so)."""
    import subprocess
    import sys

    from ...formats import FORMATS
    from ..peer_sets import build_peer_formats

    formats = {path.format for path in RESUME_PATHS.values()}
    ours = sorted(f for f in formats if not getattr(FORMATS.get(f), "PEER", False))
    subprocess.run([sys.executable, "-m", "storebench", "build", "--profile", profile,
                    "--out", str(data_dir), "--peer-sets", "--formats", *ours,
                    *([] if progress else ["--quiet"])], check=True)
    build_peer_formats(profile=profile, data_dir=data_dir, progress=progress,
                       formats=tuple(sorted(formats - set(ours))))
