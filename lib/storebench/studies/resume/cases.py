"""The resume study's case functions, the training process they kill, and the audit.

A case trains one epoch in a child process (``python -m storebench.studies.resume.cases
CONFIG.json``) that saves a checkpoint every ``every`` batches: the loader's state and the
samples delivered so far, written to a new file and renamed over the last, so a kill never
leaves half a checkpoint. The child SIGKILLs itself at seeded points of the epoch: right
after a batch was delivered, before that batch's checkpoint; or mid-batch, a timer firing a
seeded fraction of a batch's time later, while the next batch is read or handled. The
case then kills what is left of the child's process group (its workers, as a pre-emption
does) and starts a new child, which restores the last checkpoint (with another worker
count in the ``workers_changed`` scenario) and goes on, until one finishes the epoch.

Rank scenarios run ``old`` gloo ranks (``storebench.ranks.run_ranks``), each
checkpointing every ``every`` batches (rank 0 writes the states merged with
``merge_rank_states``) and killed after the same batch; then ``new`` ranks restore the
merged state and read the rest.

What is audited: every delivered sample is identified by its content (a digest of its
image bytes and label, looked up among the dataset's own samples, so a path's own indices
are not trusted), and ``audit_epoch`` counts, against an uninterrupted epoch, the samples
lost, delivered twice and unknown, and whether the order is the uninterrupted epoch's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...bench.case import Case, CaseSkipped, Trial

SEED = 7
EPOCH = 1
WORKERS = 2
CHANGED_WORKERS = 1  # the workers_changed scenario's restarts alternate 2 and 1
TF_SHUFFLE_BUFFER = 256
CHILD_TIMEOUT_S = 180.0
REAP_GRACE_S = 20.0
SCENARIOS = ("same_workers", "workers_changed", "ranks_2_to_3", "ranks_3_to_2")
RANK_SCENARIOS = {"ranks_2_to_3": (2, 3), "ranks_3_to_2": (3, 2)}
UNSUPPORTED = "unsupported: "  # the reason's prefix on the rows of paths that claim nothing
REFUSED = "refused: "  # ... and on the rows of a restore that raised


@dataclass(frozen=True)
class ResumePath:
    """One way to resume: ``kind`` says how the training process makes, saves and restores
    it; ``loader`` is its ``LOADER_PATHS`` name; ``not_run`` maps a scenario to why it is
    not run; ``unsupported`` is set for a path that makes no claim to resume."""

    name: str
    label: str
    kind: str
    loader: str
    format: str
    start_method: str | None = None
    environment: str = ""
    not_run: dict[str, str] = field(default_factory=dict)
    unsupported: str = ""


ONE_RANK = ("not run: the path here reads as one process (its wrapper refuses a "
            "distributed run), so its state is never split over ranks")
TORCHDATA_RANKS = ("not run: a StatefulDataLoader state is one rank's; torchdata has no way "
                   "to join ranks' states or split one over another world size")
# Ranks cost a gloo group per phase: run for the two distinct implementations of a rank's
# loader (our window, and the DataLoader subclass), not again for the same sampler state
# behind another transport, so the default profile's study stays near three minutes.
SAME_RANKS = ("not run, to bound the study's time: the same sampler state and merge as "
              "ProcessPrefetcher (fork), whose ranks rows measure it; tests/loaders/"
              "test_resume.py runs its ranks")
TF_WORKERS = ("not run: tf.data has no worker count (AUTOTUNE sets its parallelism); a "
              "checkpoint restores into the same pipeline only")
TF_RANKS = ("not run: a tf.data iterator checkpoint is one input pipeline's; TensorFlow "
            "cannot re-partition it over another number of pipelines")
RESUME_PATHS: dict[str, ResumePath] = {p.name: p for p in (
    ResumePath("process_fork", "ProcessPrefetcher (fork)", "ours", "process", "memmap",
               start_method="fork"),
    ResumePath("process_spawn", "ProcessPrefetcher (spawn)", "ours", "process", "memmap",
               start_method="spawn", not_run={s: SAME_RANKS for s in RANK_SCENARIOS}),
    ResumePath("thread", "ThreadPrefetcher", "ours", "thread", "memmap",
               not_run={s: SAME_RANKS for s in RANK_SCENARIOS}),
    ResumePath("torch", "ResumableDataLoader (storebench torch_adapter)", "ours", "torch",
               "memmap", start_method="fork"),
    ResumePath("torchdata", "torchdata StatefulDataLoader", "torchdata", "torchdata",
               "memmap", start_method="fork", environment="peers",
               not_run={s: TORCHDATA_RANKS for s in RANK_SCENARIOS}),
    ResumePath("litdata", "LitData StreamingDataLoader", "litdata", "litdata", "litdata",
               environment="peers", not_run={s: ONE_RANK for s in RANK_SCENARIOS}),
    ResumePath("mds", "MosaicML StreamingDataLoader", "mds", "mds", "mds",
               start_method="fork", environment="peers",
               not_run={s: ONE_RANK for s in RANK_SCENARIOS}),
    ResumePath("tf_data", "tf.data iterator checkpoint", "tf_data", "tf_data", "tfrecord",
               not_run={"workers_changed": TF_WORKERS,
                        **{s: TF_RANKS for s in RANK_SCENARIOS}}),
    ResumePath("webdataset", "WebDataset + DataLoader", "none", "webdataset", "webdataset",
               environment="peers",
               unsupported="WebDataset keeps no position to save; its maintainers advise "
                           "resampled epochs, which repeat some samples and skip others"),
    ResumePath("torch_plain", "torch DataLoader (plain)", "none", "", "memmap",
               unsupported="torch.utils.data.DataLoader has no state_dict: a restart reads "
                           "the epoch from its first batch"),
)}


def get_resume_path(name: str) -> ResumePath:
    try:
        return RESUME_PATHS[name]
    except KeyError:
        raise KeyError(f"unknown resume path {name!r}; known: {sorted(RESUME_PATHS)}"
                       ) from None


# -- the audit ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Audit:
    """What an epoch delivered against what an uninterrupted one does: samples ``lost``
    (expected, never delivered), ``duplicated`` (delivered more often than expected),
    ``unknown`` (content matching no sample of the dataset) and ``in_order`` (the
    uninterrupted epoch's order exactly; None where no order is defined, as across
    ranks of another world size)."""

    expected: int
    delivered: int
    lost: int
    duplicated: int
    unknown: int
    in_order: bool | None

    @property
    def exact(self) -> bool:
        return (self.lost == self.duplicated == self.unknown == 0
                and self.in_order is not False)

    def outcome(self) -> str:
        return audit_outcome(self.lost, self.duplicated, self.unknown, self.in_order)


def audit_outcome(lost: int, duplicated: int, unknown: int = 0,
                  in_order: bool | None = None) -> str:
    """``"exact"``, ``"exact samples, another order"`` or ``"3 lost, 5 duplicated"``."""
    if lost == duplicated == unknown == 0:
        return "exact samples, another order" if in_order is False else "exact"
    text = f"{lost} lost, {duplicated} duplicated"
    return text + (f", {unknown} unknown" if unknown else "")


def audit_epoch(delivered: Sequence[int], expected: Sequence[int], *,
                order: Sequence[int] | None = None) -> Audit:
    """Audit ``delivered`` sample ids (-1: content of no sample) against the multiset
    ``expected`` and, where given, the uninterrupted ``order``."""
    got = np.asarray(delivered, dtype=np.int64).reshape(-1)
    want = np.asarray(expected, dtype=np.int64).reshape(-1)
    if (want < 0).any():
        raise ValueError("expected sample ids must be non-negative")
    known = got[got >= 0]
    size = int(max(known.max(initial=-1), want.max(initial=-1))) + 1
    have = np.bincount(known, minlength=size)
    need = np.bincount(want, minlength=size)
    in_order = None if order is None else bool(
        np.array_equal(got, np.asarray(order, dtype=np.int64).reshape(-1)))
    return Audit(expected=len(want), delivered=len(got),
                 lost=int(np.maximum(need - have, 0).sum()),
                 duplicated=int(np.maximum(have - need, 0).sum()),
                 unknown=int((got < 0).sum()), in_order=in_order)


def sample_digests(images, labels) -> list[int]:
    """One 64-bit digest per sample of a batch: its image bytes (uint8, as delivered) and
    its label."""
    images = np.asarray(images.numpy() if hasattr(images, "numpy") else images)
    labels = np.asarray(labels.numpy() if hasattr(labels, "numpy") else labels,
                        dtype=np.int64).reshape(-1)
    out = []
    for image, label in zip(images, labels):
        digest = hashlib.blake2b(np.ascontiguousarray(image, dtype=np.uint8).tobytes(),
                                 digest_size=8)
        digest.update(int(label).to_bytes(8, "little", signed=True))
        out.append(int.from_bytes(digest.digest(), "little"))
    return out


def dataset_digests(root: Path | str) -> dict[int, int]:
    """Digest -> sample index of every sample of the dataset at ``root`` (read by our
    reader), refusing a set where two samples share a digest (ids would be ambiguous)."""
    from ...formats import open_dataset
    from ...loaders import LazyDataset

    out: dict[int, int] = {}
    with open_dataset(root) as reader:
        dataset = LazyDataset(reader)
        n = len(dataset)
        for start in range(0, n, 256):
            batch = dataset.get_batch(np.arange(start, min(n, start + 256)))
            for offset, digest in enumerate(sample_digests(batch.images, batch.labels)):
                if digest in out:
                    raise ValueError(f"{root}: samples {out[digest]} and {start + offset} "
                                     "have the same content; ids by content are ambiguous")
                out[digest] = start + offset
    return out


def ids_of(digests: Sequence[int], known: dict[int, int]) -> np.ndarray:
    return np.array([known.get(int(d), -1) for d in digests], dtype=np.int64)


# -- the training process ----------------------------------------------------------------
def _options(config: dict, workers: int):
    from ...loaders.paths import PathOptions

    return PathOptions(batch_size=config["batch_size"], workers=workers,
                       start_method=config.get("start_method"), seed=SEED,
                       root=config["root"], decode=None)


class ResumableLoader:
    """One path's loader in the training process: ``batches()`` yields ``(images,
    labels)``; ``save(directory)`` returns (state payload, its bytes); ``load(payload)``."""

    def __init__(self, config: dict, *, rank: int = 0, world_size: int = 1) -> None:
        from ...loaders.paths import get_loader_path

        self.kind = config["kind"]
        self.close_loader = None
        self.reader = None
        options = _options(config, config["workers"])
        if self.kind in ("ours", "torchdata"):
            from ...formats import open_dataset
            from ...loaders import LazyDataset, ShuffleSampler

            self.reader = open_dataset(config["root"])
            self.sampler = ShuffleSampler(len(self.reader), seed=SEED, rank=rank,
                                          world_size=world_size)
            self.sampler.set_epoch(EPOCH)
            self.loader, self.close_loader = get_loader_path(config["loader"]).open(
                LazyDataset(self.reader), self.sampler, options)
        elif self.kind == "tf_data":
            import tensorflow as tf

            from ...loaders.tf_adapter import tfrecord_pipeline

            pipeline = tfrecord_pipeline(config["root"], batch_size=config["batch_size"],
                                         shuffle_buffer=TF_SHUFFLE_BUFFER, seed=SEED)
            self.loader = iter(pipeline)
            self.checkpoint = tf.train.Checkpoint(iterator=self.loader)
        else:  # litdata, mds: the peer's own StreamingDataLoader
            self.peer, self.close_loader = get_loader_path(config["loader"]).open(
                None, None, options)
            self.loader = self.peer.loader

    def batches(self):
        """``(images, labels)`` of each batch: our ``Batch``, or a tuple (torch's, tf.data's
        and streaming's collate give one)."""
        for batch in self.peer if self.kind == "litdata" else self.loader:
            if hasattr(batch, "labels"):
                yield batch.images, batch.labels
            else:
                yield batch[0], batch[1]

    def save(self, directory: Path) -> tuple[object, int]:
        if self.kind == "tf_data":
            directory.mkdir(parents=True, exist_ok=True)
            prefix = self.checkpoint.write(str(directory / "iterator"))
            return prefix, sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
        state = self.loader.state_dict()
        if self.kind == "ours":
            payload = json.dumps(state).encode()
        else:
            payload = pickle.dumps(state)
        return payload, len(payload)

    def load(self, payload) -> None:
        if self.kind == "tf_data":
            self.checkpoint.read(payload).assert_consumed()
            return
        state = json.loads(payload) if self.kind == "ours" else pickle.loads(payload)
        self.loader.load_state_dict(state)
        if self.kind in ("ours", "torchdata"):
            self.sampler.set_epoch(EPOCH)  # the state's epoch: keeps the loaded position

    def close(self) -> None:
        if self.close_loader is not None:
            self.close_loader()
        if self.reader is not None:
            self.reader.close()


class EventLog:
    """JSON lines appended with one ``write`` each: a SIGKILL loses none already written."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, **event) -> None:
        os.write(self.fd, (json.dumps(event) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


def write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def _kill_self(log: EventLog, batches: int, mid: bool) -> None:
    log(event="kill", batches=batches, mid_batch=mid)
    os.kill(os.getpid(), signal.SIGKILL)


class Killer:
    """Kills the process after batch ``after``, or after its first batch where it starts
    past it (``mid``: ``fraction`` of a batch's time later, wherever the loop is by
    then)."""

    def __init__(self, config: dict, log: EventLog) -> None:
        self.after = config.get("kill_after")
        self.mid = bool(config.get("kill_mid"))
        self.fraction = float(config.get("kill_fraction", 0.5))
        self.log = log
        self.armed: threading.Timer | None = None
        self.last = time.perf_counter()

    def batch_delivered(self, batches: int) -> None:
        now = time.perf_counter()
        since, self.last = now - self.last, now
        # At or past it: a mid-batch kill may land batches later and checkpoint past the
        # next run's kill point, which then kills after its first batch.
        if self.after is None or batches < self.after or self.armed is not None:
            return
        if not self.mid:
            _kill_self(self.log, batches, False)
        self.armed = threading.Timer(self.fraction * since, _kill_self,
                                     args=(self.log, batches, True))
        self.armed.daemon = True
        self.armed.start()

    def epoch_ended(self) -> None:
        if self.armed is not None:  # the kill is due: the epoch's end does not outrun it
            self.armed.join()
            time.sleep(CHILD_TIMEOUT_S)


def train(config: dict, *, rank: int = 0, world_size: int = 1) -> dict:
    """One run of the training loop over one epoch (see the module docstring): restore the
    checkpoint if there is one, read on, checkpoint every ``every`` batches, die where
    ``kill_after`` says. Returns the digests this run delivered after its restore
    (``delivered``) and the epoch's so far, the checkpoint's included (``all``)."""
    log = EventLog(config["log"])
    checkpoint = Path(config["checkpoint"])
    loader = ResumableLoader(config, rank=rank, world_size=world_size)
    delivered: list[int] = []
    first_batch_at = math.nan
    try:
        restored = checkpoint.exists()
        if restored:
            saved = pickle.loads(checkpoint.read_bytes())
            loader.load(saved["state"])
            delivered = list(saved["delivered"][rank]) if world_size == saved["world_size"] \
                else []
        before = len(delivered)
        killer = Killer(config, log)
        batches = before // config["batch_size"] if world_size == 1 else 0
        for images, labels in loader.batches():
            if math.isnan(first_batch_at):
                first_batch_at = time.time()
                if restored:
                    log(event="first_batch", launch=config["launch"],
                        seconds=first_batch_at - config["launched_at"])
            delivered += sample_digests(images, labels)
            batches += 1
            killer.batch_delivered(batches)
            if batches % config["every"] == 0:
                _checkpoint(loader, checkpoint, delivered, log, rank=rank,
                            world_size=world_size)
        killer.epoch_ended()
    finally:
        loader.close()
        log.close()
    return {"delivered": delivered[before:], "all": delivered}


def _checkpoint(loader: ResumableLoader, checkpoint: Path, delivered: list[int],
                log: EventLog, *, rank: int, world_size: int) -> None:
    started = time.perf_counter()
    if world_size == 1:
        payload, size = loader.save(checkpoint.with_name(f"tf-{len(delivered)}"))
        write_atomically(checkpoint, pickle.dumps(
            {"state": payload, "delivered": [delivered], "world_size": 1}))
    else:
        from ...loaders.samplers import merge_rank_states
        from ...ranks import gather_across_ranks

        states = gather_across_ranks(loader.loader.state_dict())
        lists = gather_across_ranks(list(delivered))
        payload = json.dumps(merge_rank_states(states)).encode()
        size = len(payload)
        if rank == 0:
            write_atomically(checkpoint, pickle.dumps(
                {"state": payload, "delivered": lists, "world_size": world_size}))
    if rank == 0:
        log(event="save", seconds=time.perf_counter() - started, bytes=size)


def train_rank(rank: int, world_size: int, config: dict) -> dict:
    """``train`` as one of ``run_ranks``' gloo ranks."""
    return train(config, rank=rank, world_size=world_size)


def main(argv: Sequence[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    result = train(config)
    write_atomically(Path(config["out"]), pickle.dumps(result["all"]))
    return 0


# -- the cases ---------------------------------------------------------------------------
@dataclass
class Runs:
    """What a case's training runs left: their event logs and checkpoint."""

    directory: Path
    kills: int = 0
    mid_batch_kills: int = 0
    launches: int = 0

    @property
    def log(self) -> Path:
        return self.directory / "events.jsonl"

    @property
    def checkpoint(self) -> Path:
        return self.directory / "checkpoint.pkl"

    def events(self, name: str) -> list[dict]:
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == name]


def kill_points(case: Case, batches: int, kills: int, *, repeat: int = 0
                ) -> list[tuple[int, bool, float]]:
    """(after batch, mid-batch?, fraction of a batch) for each kill: seeded by the case,
    increasing, after the first checkpoint and before the epoch's last two batches, every
    other one mid-batch (a single kill: mid-batch or not as the seed says); each repeat
    its own."""
    rng = np.random.default_rng([SEED, repeat, *map(ord, case.case_id)])
    every = int(case.param("every"))
    candidates = np.arange(every + 1, max(every + 1, batches - 2) + 1)
    chosen = np.sort(rng.choice(candidates, size=min(kills, len(candidates)), replace=False))
    offset = int(rng.integers(2))
    return [(int(b), (k + offset) % 2 == 1, float(rng.uniform(0.2, 0.8)))
            for k, b in enumerate(chosen)]


def _base_config(case: Case, path: ResumePath, runs: Runs) -> dict:
    return {"kind": path.kind, "loader": path.loader, "root": case.dataset,
            "batch_size": case.batch_size, "start_method": path.start_method,
            "every": int(case.param("every")), "log": str(runs.log),
            "checkpoint": str(runs.checkpoint), "workers": case.workers}


def _run_child(config: dict, runs: Runs, name: str) -> subprocess.CompletedProcess:
    """Run the training process to its end or its kill; then SIGKILL its process group, so
    nothing it started outlives it."""
    config_path = runs.directory / f"{name}.json"
    runs.launches += 1
    config_path.write_text(json.dumps({**config, "launch": runs.launches,
                                       "launched_at": time.time()}))
    process = subprocess.Popen([sys.executable, "-m", __name__, str(config_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True, text=True)
    try:
        out, err = process.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise RuntimeError(f"{config['loader'] or config['kind']}: the training process "
                           f"ran past {CHILD_TIMEOUT_S:.0f} s") from None
    finally:
        reap_group(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def reap_group(group: int) -> None:
    """Give what a dead training process started ``REAP_GRACE_S`` to end on its own (its
    workers notice the death; its resource tracker unlinks its shared memory), SIGKILL what
    is left, and unlink the segments whose creator is gone."""
    import psutil

    from ...processes import remove_orphaned_shm_segments

    def left() -> list:
        out = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(proc.pid) == group and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
        return out

    deadline = time.monotonic() + REAP_GRACE_S
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in left():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    remove_orphaned_shm_segments()


def _error_line(err: str) -> str:
    """A failed process's exception, with the source line that raised it (a bare
    ``AssertionError`` says nothing alone)."""
    lines = [line.strip() for line in err.strip().splitlines() if line.strip()]
    if not lines:
        return "no message"
    raised = [line for line in lines if line.startswith("File ")]
    where = ""
    if raised:
        at = lines.index(raised[-1])
        code = lines[at + 1] if at + 1 < len(lines) - 1 else ""
        where = f" (at {raised[-1][5:].split(',')[0].strip(chr(34)).rsplit('/', 2)[-1]}: " \
                f"{code})" if code else ""
    return (lines[-1] + where)[:400]


def killed_epoch(case: Case, path: ResumePath, runs: Runs, points) -> list[int]:
    """Train one epoch through ``len(points)`` kills and restores; the digests the epoch
    delivered (from the last run, which restored what the killed ones checkpointed)."""
    base = _base_config(case, path, runs)
    changed = case.param("scenario") == "workers_changed"
    for number in range(len(points) + 1):
        workers = CHANGED_WORKERS if changed and number % 2 else case.workers
        kill = points[number] if number < len(points) else None
        config = {**base, "workers": workers, "out": str(runs.directory / "out.pkl")}
        if kill is not None:
            config.update(kill_after=kill[0], kill_mid=kill[1], kill_fraction=kill[2])
        done = _run_child(config, runs, f"run{number}")
        if kill is not None and done.returncode == -signal.SIGKILL:
            runs.kills += 1
            continue
        if done.returncode != 0 and number:
            # The path's own verdict on the restore: a row saying so, not a harness failure.
            workers = f" with {config['workers']} workers" if changed else ""
            raise CaseSkipped(f"{REFUSED}restoring{workers} raised "
                              f"{_error_line(done.stderr)}")
        if done.returncode != 0:
            raise RuntimeError(f"{path.label}: the training process failed before any kill "
                               f"(exit {done.returncode}): {_error_line(done.stderr)}")
        if kill is not None:
            raise RuntimeError(f"{path.label}: the epoch ended before its kill after batch "
                               f"{kill[0]}")
    runs.mid_batch_kills = sum(e["mid_batch"] for e in runs.events("kill"))
    return pickle.loads((runs.directory / "out.pkl").read_bytes())


def uninterrupted_order(case: Case, path: ResumePath, tmp: Path, known: dict) -> np.ndarray:
    """The sample ids of an uninterrupted epoch: our sampler's order for our paths (tested
    equal to what they deliver), else the path's own epoch in a training process of its own
    with the case's first worker count."""
    if path.kind == "ours":
        from ...loaders import ShuffleSampler

        sampler = ShuffleSampler(len(known), seed=SEED)
        sampler.set_epoch(EPOCH)
        return sampler.indices()
    runs = Runs(tmp / "uninterrupted")
    runs.directory.mkdir()
    config = {**_base_config(case, path, runs), "out": str(runs.directory / "out.pkl")}
    done = _run_child(config, runs, "uninterrupted")
    if done.returncode != 0:
        raise RuntimeError(f"{path.label}: an uninterrupted epoch failed "
                           f"(exit {done.returncode}): {_error_line(done.stderr)}")
    return ids_of(pickle.loads((runs.directory / "out.pkl").read_bytes()), known)


def _costs(runs: Runs) -> dict[str, tuple[float, str]]:
    """The checkpoints' median size and save time; the restarts' median time from launch
    to the first resumed batch (across ranks: the last rank's)."""
    saves = runs.events("save")
    restarts: dict[int, float] = {}
    for event in runs.events("first_batch"):
        restarts[event["launch"]] = max(restarts.get(event["launch"], 0.0), event["seconds"])
    out: dict[str, tuple[float, str]] = {"checkpoints": (len(saves), "count")}
    if saves:
        out["checkpoint_bytes"] = (float(np.median([e["bytes"] for e in saves])), "bytes")
        out["checkpoint_save_s"] = (float(np.median([e["seconds"] for e in saves])), "s")
    if restarts:
        out["restart_to_first_batch_s"] = (float(np.median(list(restarts.values()))), "s")
    return out


def _audit_metrics(audit: Audit) -> dict[str, tuple[float, str]]:
    out = {"expected_samples": (audit.expected, "count"),
           "delivered_samples": (audit.delivered, "count"),
           "lost": (audit.lost, "count"), "duplicated": (audit.duplicated, "count"),
           "unknown_samples": (audit.unknown, "count"),
           "exact": (float(audit.exact), "ratio")}
    if audit.in_order is not None:
        out["in_order"] = (float(audit.in_order), "ratio")
    return out


def _check_runnable(case: Case) -> ResumePath:
    path = get_resume_path(case.param("path"))
    if path.unsupported:
        raise CaseSkipped(UNSUPPORTED + path.unsupported)
    reason = path.not_run.get(case.param("scenario"))
    if reason:
        raise CaseSkipped(reason)
    if path.environment:
        from ...environments import needs_text
        from ...loaders.paths import get_loader_path

        missing = needs_text(get_loader_path(path.loader).libraries,
                             what=f"loader path {path.loader!r}")
        if missing:
            raise CaseSkipped(missing)
    if not Path(case.dataset).is_dir():
        raise CaseSkipped(f"{case.dataset} is not built: storebench build --peer-sets "
                          f"--formats {case.format}")
    return path


def reference_set(case: Case) -> Path:
    """Our memmap build of the same samples, beside the case's set: what every path's
    deliveries are identified against."""
    return Path(case.dataset).parent / "memmap-raw"


def resume_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """One path, one scenario: an epoch killed ``kills`` times and resumed, audited against
    an uninterrupted one; the checkpoints' size and save time, and the restarts' time to
    their first batch."""
    path = _check_runnable(case)
    if case.param("scenario") in RANK_SCENARIOS:
        return ranks_case(case, path, repeat=max(trial.repeat, 0))
    known = dataset_digests(reference_set(case))
    batches = math.ceil(len(known) / case.batch_size)
    points = kill_points(case, batches, int(case.param("kills")), repeat=max(trial.repeat, 0))
    with tempfile.TemporaryDirectory(prefix="storebench-resume-") as tmp:
        order = uninterrupted_order(case, path, Path(tmp), known)
        runs = Runs(Path(tmp) / "killed")
        runs.directory.mkdir()
        delivered = ids_of(killed_epoch(case, path, runs, points), known)
        costs = _costs(runs)
    audit = audit_epoch(delivered, np.arange(len(known)), order=order)
    return {**_audit_metrics(audit), **costs, "kills": (runs.kills, "count"),
            "mid_batch_kills": (runs.mid_batch_kills, "count")}


def ranks_case(case: Case, path: ResumePath, *, repeat: int = 0
               ) -> dict[str, tuple[float, str]]:
    """``old`` gloo ranks killed after the same seeded batch, then ``new`` ranks restoring
    the merged state: each sample of the epoch at the old world size exactly once."""
    from ...loaders import ShuffleSampler
    from ...processes import remove_orphaned_shm_segments
    from ...ranks import RankDiedError, run_ranks

    old, new = RANK_SCENARIOS[case.param("scenario")]
    known = dataset_digests(reference_set(case))
    share = math.ceil(len(known) / old)
    ((after, _, _),) = kill_points(case, math.ceil(share / case.batch_size), 1, repeat=repeat)
    expected = []
    for rank in range(old):
        sampler = ShuffleSampler(len(known), seed=SEED, rank=rank, world_size=old)
        sampler.set_epoch(EPOCH)
        expected += sampler.indices().tolist()
    with tempfile.TemporaryDirectory(prefix="storebench-resume-ranks-") as tmp:
        runs = Runs(Path(tmp))
        config = {**_base_config(case, path, runs), "kill_after": after, "launch": 1,
                  "launched_at": time.time()}
        try:
            run_ranks(train_rank, old, args=(config,), start_method="fork",
                      timeout_s=CHILD_TIMEOUT_S)
            raise RuntimeError(f"{path.label}: the ranks finished the epoch before their "
                               f"kill after batch {after}")
        except RankDiedError:
            # Each killed rank's resource tracker unlinks its segments (and warns of them as
            # leaked); a rank stopped by SIGTERM may leave its own to this.
            remove_orphaned_shm_segments()
        saved = pickle.loads(runs.checkpoint.read_bytes())
        # No checkpoints after the resize: the new shares may differ by a batch, and a rank
        # with one batch more would wait for the others in the checkpoint's gather.
        restart = {**config, "kill_after": None, "every": 1 << 62, "launch": 2,
                   "launched_at": time.time()}
        results = run_ranks(train_rank, new, args=(restart,), start_method="fork",
                            timeout_s=CHILD_TIMEOUT_S)
        costs = _costs(runs)
    delivered = [d for rank in saved["delivered"] for d in rank]
    delivered += [d for r in results for d in r["delivered"]]
    audit = audit_epoch(ids_of(delivered, known), expected)
    return {**_audit_metrics(audit), **costs, "kills": (1, "count"),
            "mid_batch_kills": (0, "count")}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
