"""A seeded corruption fuzzer: damage copies of built datasets, read them in both verify modes.

For every dataset under a data directory (every format and encoding built there), the fuzzer
makes ``copies_per_dataset`` damaged copies, cycling through the damage classes in
``DAMAGES`` that apply to it: flipped bytes, zeroed ranges, truncation, appended garbage,
two of its files swapped, a file replaced by another dataset's file of the same name, a
deleted file, a damaged offset index, and edited manifests. Each copy is opened with
``open_dataset(path, verify=...)`` in both modes and every sample is read twice, by
``read_many`` in batches and by ``reader[i]``, then compared with the undamaged build read
with ``verify=True``.

Every read runs in a worker process killed after ``timeout_s``, so that a hang or an
interpreter crash (SIGBUS, SIGSEGV) is counted rather than fatal. Each (copy, verify mode)
is one row, classified as one of ``OUTCOMES``:

- ``detected``: a ``DatasetError`` was raised and no sample came back wrong;
- ``harmless``: every sample came back equal to the undamaged bytes (e.g. damage in padding);
- ``silent_wrong``: a sample came back different without an error on that read (or samples
  went missing without any error);
- ``hang``: the read outlived ``timeout_s``; ``crash``: the worker died (signal or exit);
- ``other_error``: an exception that is not a ``DatasetError`` (its type is recorded).

Copies are rebuilt exactly from ``(seed, dataset, copy)``: ``make_damaged_copy``.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import filecmp
import hashlib
import json
import multiprocessing
import multiprocessing.connection
import os
import resource
import shutil
import signal
import tempfile
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .formats import FORMATS, DatasetError, find_datasets, open_dataset, read_manifest
from .formats.manifest import MANIFEST_NAME

if TYPE_CHECKING:
    import pandas as pd

OUTCOMES = ("detected", "harmless", "silent_wrong", "hang", "crash", "other_error")
COLUMNS = (
    "dataset", "format", "encoding", "damage", "detail", "verify", "seed", "copy",
    "outcome", "exception", "message", "names_file", "wrong_samples", "seconds",
)
FUZZ_DIR_PREFIX = "storebench-fuzz-"
# Damage aimed near the start and end of a file hits headers, footers and indexes (HDF5
# superblock, Parquet footer, .npy headers, LMDB meta pages) far more often than uniform
# offsets in a large file would.
_EDGE_BYTES = 4096
_DIGEST_BYTES = 16
_MESSAGE_CHARS = 1000


# ---------------------------------------------------------------------------------------
# Damage
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FuzzTarget:
    """One built dataset to damage. ``files`` are its data files (from the manifest);
    ``donors`` are datasets whose same-named files can replace its own."""

    name: str
    path: Path
    format: str
    encoding: str
    files: tuple[str, ...]
    donors: tuple[Path, ...] = ()

    @classmethod
    def from_path(cls, path: Path | str, *, name: str | None = None,
                  donors: Sequence[Path] = ()) -> FuzzTarget:
        path = Path(path)
        manifest = read_manifest(path)
        return cls(name or path.name, path, manifest["format"], manifest["spec"]["encoding"],
                   tuple(sorted(manifest["files"])), tuple(donors))


@dataclass(frozen=True)
class Damage:
    """A damage class: ``apply(root, target, rng)`` damages the copy at ``root`` and says
    what it did; ``applies(target)`` tells whether the class fits the dataset at all.
    ``content`` marks damage to stored bytes that only a content check can see."""

    apply: Callable[[Path, FuzzTarget, np.random.Generator], str]
    applies: Callable[[FuzzTarget], bool] = lambda target: True
    content: bool = False


def _kinds(files: Sequence[str]) -> dict[str, list[str]]:
    """Files grouped by suffix: a pick per kind gives small files (indexes, labels) as
    much chance as the large ones."""
    kinds: dict[str, list[str]] = {}
    for rel in sorted(files):
        kinds.setdefault(Path(rel).suffix, []).append(rel)
    return kinds


def _pick_file(files: Sequence[str], rng: np.random.Generator) -> str:
    kinds = _kinds(files)
    group = kinds[sorted(kinds)[rng.integers(len(kinds))]]
    return group[rng.integers(len(group))]


def _pick_offset(size: int, length: int, rng: np.random.Generator) -> int:
    """An offset for ``length`` bytes in a file of ``size``: near the start, near the end,
    or anywhere, one third each."""
    last = size - length
    region = rng.integers(3)
    if region == 0:
        return int(rng.integers(0, min(last, _EDGE_BYTES) + 1))
    if region == 1:
        return int(rng.integers(max(0, last - _EDGE_BYTES), last + 1))
    return int(rng.integers(0, last + 1))


def _nonempty_files(root: Path, target: FuzzTarget) -> list[str]:
    return [rel for rel in target.files if (root / rel).stat().st_size > 0]


def _flip_bytes(root: Path, target: FuzzTarget, rng: np.random.Generator) -> str:
    rel = _pick_file(_nonempty_files(root, target), rng)
    path = root / rel
    data = bytearray(path.read_bytes())
    count = int(rng.integers(1, 9))
    offsets = sorted({_pick_offset(len(data), 1, rng) for _ in range(count)})
    for offset in offsets:
        data[offset] ^= int(rng.integers(1, 256))
    path.write_bytes(bytes(data))
    return f"{rel}: flipped bytes at {offsets}"


def _zero_range(root: Path, target: FuzzTarget, rng: np.random.Generator) -> str:
    rel = _pick_file(_nonempty_files(root, target), rng)
    path = root / rel
    size = path.stat().st_size
    # Log-uniform length: single bytes as often as whole 64 KiB regions.
    length = int(np.exp(rng.uniform(0, np.log(min(size, 1 << 16)) + 1e-9)))
    length = max(1, min(length, size))
    offset = _pick_offset(size, length, rng)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(length))
    return f"{rel}: zeroed {length} bytes at {offset}"


def _truncate(root: Path, target: FuzzTarget, rng: np.random.Generator) -> str:
    rel = _pick_file(_nonempty_files(root, target), rng)
    path = root / rel
    size = path.stat().st_size
    new_size = _pick_offset(size, 1, rng)  # in [0, size - 1]
    os.truncate(path, new_size)
    return f"{rel}: truncated from {size} to {new_size} bytes"


def _append_garbage(root: Path, target: FuzzTarget, rng: np.random.Generator) -> str:
    rel = _pick_file(target.files, rng)
    count = int(rng.integers(1, 4097))
    zeros = bool(rng.integers(2))
    garbage = bytes(count) if zeros else rng.bytes(count)
    with open(root / rel, "ab") as f:
        f.write(garbage)
    return f"{rel}: appended {count} {'zero' if zeros else 'random'} bytes"


def _swappable(target: FuzzTarget) -> list[list[str]]:
    return [group for group in _kinds(target.files).values() if len(group) >= 2]


def _swap_files(root: Path, target: FuzzTarget, rng: np.random.Generator) -> str:
    # Two files with the same bytes (a raw TFRecord's shard indexes) would swap to no damage.
    groups = _swappable(target)
    tries = []
    for g in rng.permutation(len(groups)):
        group = groups[g]
        tries += [tuple(group[i] for i in rng.choice(len(group), size=2, replace=False))
                  for _ in range(8)]
    first, second = next(
        (pair for pair in tries
         if not filecmp.cmp(root / pair[0], root / pair[1], shallow=False)), tries[0])
    pairs = [(first, second)]
    # With their companions (a shard's .index beside it) half of the time: the pair then
    # stays self-consistent, and only an identity check can tell.
    companions = [
        (str(Path(first).with_suffix(kind)), str(Path(second).with_suffix(kind)))
        for kind in _kinds(target.files) if kind != Path(first).suffix
    ]
    companions = [(a, b) for a, b in companions if a in target.files and b in target.files]
    if companions and rng.integers(2):
        pairs += companions
    for a, b in pairs:
        swap = root / f"{a}.fuzz-swap"
        os.replace(root / a, swap)
        os.replace(root / b, root / a)
        os.replace(swap, root / b)
    return "swapped " + ", ".join(f"{a} <-> {b}" for a, b in pairs)


def _shared_files(target: FuzzTarget) -> list[tuple[Path, list[str]]]:
    shared = []
    for donor in target.donors:
        names = [rel for rel in target.files if (donor / rel).is_file()]
        if names:
            shared.append((donor, names))
    return shared


def _foreign_file(root: Path, target: FuzzTarget, rng: np.random.Generator) -> str:
    shared = _shared_files(target)
    tries = []
    for _ in range(16):
        donor, names = shared[rng.integers(len(shared))]
        tries.append((donor, _pick_file(names, rng)))
    # A same-named file with the same bytes (a raw TFRecord's shard index) is no damage.
    donor, rel = next(
        ((donor, rel) for donor, rel in tries
         if not filecmp.cmp(donor / rel, root / rel, shallow=False)), tries[0])
    shutil.copyfile(donor / rel, root / rel)
    return f"{rel}: replaced by {donor.name}'s {rel}"


def _delete_file(root: Path, target: FuzzTarget, rng: np.random.Generator) -> str:
    rel = _pick_file(target.files, rng)
    (root / rel).unlink()
    return f"{rel}: deleted"


def _index_files(target: FuzzTarget) -> list[str]:
    return [rel for rel in target.files if rel.endswith(".index")]


def _index_entries(path: Path) -> tuple[int, int, int]:
    """(offset of the first entry, entry size in bytes, entries) of a 2-D .npy index."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read_header(f)
        start = f.tell()
    entry = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    return start, entry, int(shape[0])


def _zero_index_entry(root: Path, target: FuzzTarget, rng: np.random.Generator) -> str:
    rel = _pick_file(_index_files(target), rng)
    start, entry, count = _index_entries(root / rel)
    victim = int(rng.integers(count))
    with open(root / rel, "r+b") as f:
        f.seek(start + victim * entry)
        f.write(bytes(entry))
    return f"{rel}: entry {victim} of {count} zeroed"


def _copy_index_entry(root: Path, target: FuzzTarget, rng: np.random.Generator) -> str:
    """Entry ``victim`` points at another sample's record: well framed, CRCs intact."""
    rel = _pick_file(_index_files(target), rng)
    start, entry, count = _index_entries(root / rel)
    victim, source = (int(i) for i in rng.choice(count, size=2, replace=False))
    with open(root / rel, "r+b") as f:
        f.seek(start + source * entry)
        data = f.read(entry)
        f.seek(start + victim * entry)
        f.write(data)
    return f"{rel}: entry {victim} of {count} overwritten with entry {source}"


def _edit_manifest(root: Path, edit: Callable[[dict], str], *, reseal: bool = True) -> str:
    """Apply ``edit`` to the copy's manifest. ``reseal`` recomputes the manifest's own digest,
    so that the edit gets past it and meets the readers' checks of spec against data (as a
    manifest written by a buggy tool would); without it, the digest alone must refuse it."""
    from .formats.manifest import manifest_digest

    path = root / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    detail = edit(manifest)
    if reseal and "manifest_digest" in manifest:
        manifest["manifest_digest"] = manifest_digest(manifest)
        detail += ", digest resealed"
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return f"{MANIFEST_NAME}: {detail}"


def _manifest_encoding(root: Path, target: FuzzTarget, rng: np.random.Generator, *,
                       reseal: bool = True) -> str:
    from data_gen import ENCODINGS

    def edit(manifest: dict) -> str:
        others = [e for e in ENCODINGS if e != manifest["spec"]["encoding"]]
        new = others[rng.integers(len(others))]
        old = manifest["spec"]["encoding"]
        manifest["spec"]["encoding"] = manifest["encoding"] = new
        return f"encoding {old} -> {new}"

    return _edit_manifest(root, edit, reseal=reseal)


def _manifest_format(root: Path, target: FuzzTarget, rng: np.random.Generator, *,
                     reseal: bool = True) -> str:
    def edit(manifest: dict) -> str:
        old, encoding = manifest["format"], manifest["spec"]["encoding"]
        # Prefer a format that could hold this encoding: the more plausible mistake.
        others = [n for n, m in FORMATS.items() if n != old and encoding in m.ENCODINGS]
        others = others or [n for n in FORMATS if n != old]
        manifest["format"] = others[rng.integers(len(others))]
        return f"format {old} -> {manifest['format']}"

    return _edit_manifest(root, edit, reseal=reseal)


def _manifest_shape(root: Path, target: FuzzTarget, rng: np.random.Generator, *,
                    reseal: bool = True) -> str:
    def edit(manifest: dict) -> str:
        spec = manifest["spec"]
        h, w, c = spec["height"], spec["width"], spec["channels"]
        # Same byte count per sample first: raw data then still "fits" the wrong shape.
        options = [(h * 2, w // 2, c)] if w % 2 == 0 else []
        options += [(w, h, c)] if h != w else []
        options += [(h + 1, w, c), (h, w, 4 - c)]
        new = options[rng.integers(len(options))]
        spec["height"], spec["width"], spec["channels"] = new
        return f"shape {(h, w, c)} -> {new}"

    return _edit_manifest(root, edit, reseal=reseal)


def _manifest_num_samples(root: Path, target: FuzzTarget, rng: np.random.Generator, *,
                          reseal: bool = True) -> str:
    def edit(manifest: dict) -> str:
        n = manifest["num_samples"]
        options = sorted({n - 1, n // 2, n + 1, 2 * n} - {n, 0})
        new = int(options[rng.integers(len(options))])
        manifest["num_samples"] = manifest["spec"]["num_samples"] = new
        return f"num_samples {n} -> {new}"

    return _edit_manifest(root, edit, reseal=reseal)


def _manifest_unknown_format(root: Path, target: FuzzTarget, rng: np.random.Generator, *,
                             reseal: bool = True) -> str:
    def edit(manifest: dict) -> str:
        old = manifest["format"]
        manifest["format"] = f"{old}-v{int(rng.integers(2, 100))}"
        return f"format {old} -> {manifest['format']} (unknown)"

    return _edit_manifest(root, edit, reseal=reseal)


_MANIFEST_EDITS = (_manifest_encoding, _manifest_format, _manifest_shape,
                   _manifest_num_samples, _manifest_unknown_format)


def _manifest_unsealed(root: Path, target: FuzzTarget, rng: np.random.Generator) -> str:
    """One of the manifest edits, by hand: the manifest's digest left as it was."""
    edit = _MANIFEST_EDITS[rng.integers(len(_MANIFEST_EDITS))]
    return edit(root, target, rng, reseal=False)


DAMAGES: dict[str, Damage] = {
    "flip_bytes": Damage(_flip_bytes, content=True),
    "zero_range": Damage(_zero_range, content=True),
    "truncate": Damage(_truncate),
    "append_garbage": Damage(_append_garbage),
    "swap_files": Damage(_swap_files, applies=lambda t: bool(_swappable(t))),
    "foreign_file": Damage(_foreign_file, applies=lambda t: bool(_shared_files(t))),
    "delete_file": Damage(_delete_file),
    "zero_index_entry": Damage(_zero_index_entry, applies=lambda t: bool(_index_files(t))),
    "copy_index_entry": Damage(_copy_index_entry, applies=lambda t: bool(_index_files(t))),
    "manifest_encoding": Damage(_manifest_encoding),
    "manifest_format": Damage(_manifest_format),
    "manifest_shape": Damage(_manifest_shape),
    "manifest_num_samples": Damage(_manifest_num_samples),
    "manifest_unknown_format": Damage(_manifest_unknown_format),
    "manifest_unsealed": Damage(_manifest_unsealed),
}


def damages_for(target: FuzzTarget) -> list[str]:
    """The damage classes that apply to ``target``, in ``DAMAGES`` order."""
    return [name for name, damage in DAMAGES.items() if damage.applies(target)]


def damage_for_copy(target: FuzzTarget, copy: int) -> str:
    """Copy ``copy`` of a dataset gets the applicable classes in turn."""
    classes = damages_for(target)
    return classes[copy % len(classes)]


def copy_rng(seed: int, target: FuzzTarget, copy: int) -> np.random.Generator:
    """The generator for one copy: the same (seed, dataset name, copy) damages the same way,
    whatever else is fuzzed in the run."""
    return np.random.default_rng([seed, zlib.crc32(target.name.encode()), copy])


def make_damaged_copy(target: FuzzTarget, dest: Path | str, *, seed: int, copy: int,
                      damage: str | None = None) -> tuple[str, str]:
    """Copy ``target`` to ``dest`` and damage it as the fuzzer's copy ``copy`` of run
    ``seed``. Returns (damage class, what was done)."""
    damage = damage or damage_for_copy(target, copy)
    if damage not in DAMAGES:
        raise KeyError(f"unknown damage {damage!r}; known: {sorted(DAMAGES)}")
    if not DAMAGES[damage].applies(target):
        raise ValueError(f"damage {damage!r} does not apply to {target.name}")
    dest = Path(dest)
    shutil.copytree(target.path, dest)
    return damage, DAMAGES[damage].apply(dest, target, copy_rng(seed, target, copy))


def catchable_without_verify(format_name: str, damage: str) -> bool:
    """Whether ``verify=False`` must still catch ``damage``: everything but damage to stored
    bytes, which only formats with their own content checks (``TRAITS.checks_content``) can
    see; elsewhere only the per-sample checksum (verify=True) tells a flipped pixel from a
    real one."""
    from .formats import traits

    return not DAMAGES[damage].content or traits(format_name).checks_content


# ---------------------------------------------------------------------------------------
# Reading a copy (in a worker process)
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadReport:
    """What reading one dataset returned. ``digests`` (the samples read by ``read_many``)
    only when no expected digests were given."""

    length: int = -1
    wrong: int = 0
    first_wrong: int = -1
    dataset_errors: int = 0
    dataset_error: tuple[str, str] = ("", "")
    other_errors: int = 0
    other_error: tuple[str, str] = ("", "")
    digests: bytes = b""


def sample_digest(image, label) -> bytes:
    """A digest of what a reader returned: type, dtype and shape, bytes and label."""
    h = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    if isinstance(image, np.ndarray):
        h.update(f"array {image.dtype.str} {image.shape}|".encode())
        h.update(np.ascontiguousarray(image).tobytes())
    else:
        h.update(b"bytes|" + bytes(image))
    h.update(int(label).to_bytes(8, "little", signed=True))
    return h.digest()


def error_name(err: BaseException) -> str:
    kind = type(err)
    if kind.__module__ == "builtins" or kind.__module__.startswith("storebench."):
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def read_everything(path: str, *, verify: bool, batch_size: int = 64,
                    expected: bytes | None = None) -> ReadReport:
    """Open ``path`` and read every sample, by ``read_many`` in batches and by
    ``reader[i]``, going on past errors; compare each sample with ``expected`` (digests in
    index order; without it, the batches' samples are the reference)."""
    counts: Counter = Counter()
    first: dict[str, tuple[str, str]] = {}
    wrong: list[int] = []

    def failed(err: Exception) -> None:
        kind = "dataset" if isinstance(err, DatasetError) else "other"
        counts[kind] += 1
        first.setdefault(kind, (error_name(err), str(err)))

    digests: list[bytes] = []
    length = -1
    try:
        reader = open_dataset(path, verify=verify)
    except Exception as err:
        failed(err)
    else:
        with reader:
            try:
                length = len(reader)
                reference = expected

                def check(index: int, image, label) -> None:
                    digest = sample_digest(image, label)
                    if reference is None:
                        digests.append(digest)
                        return
                    at = index * _DIGEST_BYTES
                    if reference[at : at + _DIGEST_BYTES] != digest:
                        wrong.append(index)

                for start in range(0, length, batch_size):
                    indices = np.arange(start, min(start + batch_size, length))
                    try:
                        images, labels = reader.read_many(indices)
                        for k, i in enumerate(indices):
                            check(int(i), images[k], labels[k])
                    except Exception as err:
                        failed(err)
                if reference is None:
                    reference = b"".join(digests)
                for i in range(length):
                    try:
                        image, label = reader[i]
                        check(i, image, label)
                    except Exception as err:
                        failed(err)
            except Exception as err:
                failed(err)
    return ReadReport(
        length=length,
        wrong=len(set(wrong)),
        first_wrong=min(wrong, default=-1),
        dataset_errors=counts["dataset"],
        dataset_error=first.get("dataset", ("", "")),
        other_errors=counts["other"],
        other_error=first.get("other", ("", "")),
        digests=b"".join(digests) if expected is None else b"",
    )


def classify(report: ReadReport, expected_length: int) -> tuple[str, str, str]:
    """(outcome, exception type, message) of a finished read. Wrong samples outrank every
    error: a training loop would already have consumed them."""
    error = report.other_error if report.other_errors else report.dataset_error
    missing = 0 <= report.length < expected_length
    if report.wrong or (missing and not report.dataset_errors and not report.other_errors):
        kind, message = error
        what = (f"{report.wrong} sample(s) differ from the undamaged build, the first is "
                f"{report.first_wrong}" if report.wrong else
                f"{report.length} samples, the undamaged build has {expected_length}")
        return "silent_wrong", kind, f"{what}; {message}" if message else what
    if report.other_errors:
        return "other_error", *report.other_error
    if report.dataset_errors:
        return "detected", *report.dataset_error
    return "harmless", "", ""


# ---------------------------------------------------------------------------------------
# Worker processes that can be killed
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskResult:
    """How a task ended: ``status`` ``ok`` (with ``value``), ``error`` (the task raised;
    ``error`` says what), ``hang`` or ``crash``; ``log`` is what the worker wrote meanwhile
    (a faulthandler traceback for hangs and crashes)."""

    key: object
    status: str
    value: object = None
    error: str = ""
    log: str = ""
    seconds: float = 0.0


def _pool_worker(conn, parent_pid: int, log_path: str, timeout_s: float,
                 memory_limit_bytes: int | None) -> None:
    from .processes import die_with_parent

    die_with_parent(parent_pid)
    # Ctrl-C reaches the whole process group; the parent decides, and kills its workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    faulthandler.enable()
    if memory_limit_bytes:
        # A damaged length field must end in MemoryError, not in the machine swapping.
        resource.setrlimit(resource.RLIMIT_DATA, (memory_limit_bytes, memory_limit_bytes))
    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        function, kwargs = task
        # Where a hang is, written by faulthandler's own thread: it needs no GIL.
        faulthandler.dump_traceback_later(max(timeout_s / 2, timeout_s - 5.0), exit=False)
        try:
            conn.send(("ok", function(**kwargs)))
        except Exception as err:
            conn.send(("error", f"{error_name(err)}: {err}"))
        finally:
            faulthandler.cancel_dump_traceback_later()


class _Slot:
    def __init__(self, number: int, log_path: Path) -> None:
        self.number = number
        self.log_path = log_path
        self.process = None
        self.conn = None
        self.ready = False
        self.task = None
        self.started = 0.0
        self.log_offset = 0


class KillablePool:
    """Worker processes (spawned, so nothing of this process is inherited) that run one task
    at a time each; a task past ``timeout_s`` is a ``hang`` and its worker is killed, a
    worker that dies is a ``crash``; either way a fresh worker takes its place.

    Use as a context manager: leaving it kills the workers. Workers also die with this
    process (``die_with_parent``).
    """

    def __init__(self, *, workers: int, timeout_s: float, log_dir: Path | str,
                 memory_limit_bytes: int | None = None, start_timeout_s: float = 120.0) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.memory_limit_bytes = memory_limit_bytes
        self.start_timeout_s = start_timeout_s
        self._context = multiprocessing.get_context("spawn")
        log_dir = Path(log_dir)
        self._slots = [_Slot(i, log_dir / f"worker-{i}.log") for i in range(workers)]
        self._queue: deque = deque()
        for slot in self._slots:
            self._start(slot)

    def __enter__(self) -> KillablePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for slot in self._slots:
            self._stop(slot)

    @property
    def busy(self) -> int:
        """Tasks queued or running."""
        return sum(slot.task is not None for slot in self._slots) + len(self._queue)

    @property
    def idle(self) -> bool:
        """Whether a submitted task would start at once."""
        return not self._queue and any(s.task is None for s in self._slots)

    def submit(self, key, function: Callable, **kwargs) -> None:
        """Run ``function(**kwargs)`` in a worker (``function`` must be importable)."""
        self._queue.append((key, function, kwargs))
        self._dispatch()

    def results(self) -> list[TaskResult]:
        """Wait until at least one task ends (or a deadline passes) and return those that
        ended."""
        done: list[TaskResult] = []
        while not done and self.busy:
            waiting = [s for s in self._slots if s.task is not None or not s.ready]
            timeout = max(0.0, min(map(self._deadline, waiting)) - time.monotonic())
            handles = {}
            for slot in waiting:
                handles[slot.conn] = slot
                handles[slot.process.sentinel] = slot
            ready = multiprocessing.connection.wait(list(handles), timeout)
            for slot in {handles[h].number: handles[h] for h in ready}.values():
                done += self._collect(slot)
            now = time.monotonic()
            for slot in waiting:
                if slot.process is not None and now > self._deadline(slot):
                    done += self._expire(slot)
            self._dispatch()
        return done

    # -- internals ------------------------------------------------------------------------
    def _deadline(self, slot: _Slot) -> float:
        return slot.started + (self.timeout_s if slot.ready else self.start_timeout_s)

    def _start(self, slot: _Slot) -> None:
        parent_conn, child_conn = self._context.Pipe()
        slot.process = self._context.Process(
            target=_pool_worker,
            args=(child_conn, os.getpid(), str(slot.log_path), self.timeout_s,
                  self.memory_limit_bytes),
            name=f"storebench-fuzz-{slot.number}",
            daemon=True,
        )
        slot.process.start()
        child_conn.close()
        slot.conn, slot.ready, slot.task = parent_conn, False, None
        slot.started = time.monotonic()

    def _stop(self, slot: _Slot) -> None:
        if slot.process is not None:
            slot.process.kill()
            slot.process.join()
            slot.process.close()
            slot.conn.close()
        slot.process = slot.conn = None
        slot.ready, slot.task = False, None

    def _log_since(self, slot: _Slot) -> str:
        try:
            with open(slot.log_path, "rb") as f:
                f.seek(slot.log_offset)
                return f.read().decode(errors="replace")[-_MESSAGE_CHARS:]
        except OSError:
            return ""

    def _dispatch(self) -> None:
        for slot in self._slots:
            if not self._queue:
                return
            if slot.ready and slot.task is None:
                key, function, kwargs = self._queue.popleft()
                slot.task = key
                slot.log_offset = slot.log_path.stat().st_size if slot.log_path.exists() else 0
                slot.started = time.monotonic()
                slot.conn.send((function, kwargs))

    def _collect(self, slot: _Slot) -> list[TaskResult]:
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            message = None
        if message is not None and not slot.ready:
            slot.ready = True
            return []
        if message is not None:
            key, seconds = slot.task, time.monotonic() - slot.started
            slot.task = None
            status, value = message
            if status == "ok":
                return [TaskResult(key, "ok", value, seconds=seconds)]
            return [TaskResult(key, "error", error=value, log=self._log_since(slot),
                               seconds=seconds)]
        return self._died(slot)

    def _died(self, slot: _Slot) -> list[TaskResult]:
        slot.process.join(5)
        code = slot.process.exitcode
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}")
        if not slot.ready:
            log = self._log_since(slot)
            self._stop(slot)
            raise RuntimeError(f"a fuzz worker {how} while starting:\n{log}")
        key, seconds, log = slot.task, time.monotonic() - slot.started, self._log_since(slot)
        self._stop(slot)
        self._start(slot)
        return [TaskResult(key, "crash", error=how, log=log, seconds=seconds)]

    def _expire(self, slot: _Slot) -> list[TaskResult]:
        if not slot.ready:
            log = self._log_since(slot)
            self._stop(slot)
            raise RuntimeError(
                f"a fuzz worker did not start within {self.start_timeout_s:g} s:\n{log}")
        key, seconds = slot.task, time.monotonic() - slot.started
        self._stop(slot)
        log = self._log_since(slot)
        self._start(slot)
        return [TaskResult(key, "hang", error=f"no answer within {self.timeout_s:g} s",
                           log=log, seconds=seconds)]


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------
def build_donors(targets: Sequence[FuzzTarget], out_dir: Path, *,
                 progress: bool = False) -> dict[str, Path]:
    """For each target, the same format, knobs and spec built with the next seed: files of
    the same names and (raw) sizes, different samples. Returns name -> path."""
    from data_gen import DatasetSpec

    from .formats import build_dataset
    from .formats.build import SampleCache

    by_spec: dict[DatasetSpec, list[FuzzTarget]] = {}
    manifests = {t.name: read_manifest(t.path) for t in targets}
    for target in targets:
        spec = DatasetSpec.from_dict(manifests[target.name]["spec"])
        by_spec.setdefault(dataclasses.replace(spec, seed=spec.seed + 1), []).append(target)
    donors = {}
    out_dir.mkdir(parents=True, exist_ok=True)
    for spec, group in by_spec.items():
        with SampleCache(spec, out_dir, workers=1, progress=progress) as source:
            for target in group:
                built = build_dataset(
                    spec, target.format, out_dir, knobs=manifests[target.name]["knobs"],
                    name=f"{target.name.replace(os.sep, '_')}-seed{spec.seed}", workers=1,
                    source=source,
                )
                donors[target.name] = built.path
    return donors


def fuzz_targets(data_dir: Path | str, scratch: Path, *, formats: Sequence[str] | None = None,
                 progress: bool = False) -> list[FuzzTarget]:
    """Every dataset under ``data_dir`` (of ``formats``), with its donors: its next-seed
    build and the other datasets of its format."""
    data_dir = Path(data_dir)
    unknown = set(formats or ()) - set(FORMATS)
    if unknown:
        raise KeyError(f"unknown format(s) {sorted(unknown)}; known formats: {sorted(FORMATS)}")
    found = [FuzzTarget.from_path(p, name=str(p.relative_to(data_dir)) if p != data_dir
                                  else p.name) for p in find_datasets(data_dir)]
    found = [t for t in found if formats is None or t.format in formats]
    if not found:
        raise DatasetError(f"{data_dir}: no dataset (manifest.json) to fuzz")
    donors = build_donors(found, scratch / "donors", progress=progress)
    return [
        dataclasses.replace(target, donors=(donors[target.name], *(
            other.path for other in found
            if other.format == target.format and other.name != target.name)))
        for target in found
    ]


def _clean_message(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        text = text.replace(old, new)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines)[:_MESSAGE_CHARS]


def run_fuzz(
    data_dir: Path | str,
    *,
    copies_per_dataset: int = 50,
    seed: int = 0,
    timeout_s: float = 30.0,
    workers: int = 2,
    formats: Sequence[str] | None = None,
    progress: bool = True,
    batch_size: int = 64,
    scratch_dir: Path | str | None = None,
    memory_limit_bytes: int | None = 2 << 30,
) -> pd.DataFrame:
    """Fuzz every dataset under ``data_dir``: ``copies_per_dataset`` damaged copies each,
    each read with ``verify=True`` and with ``verify=False`` in a worker killed after
    ``timeout_s``. Returns one row per (copy, verify mode), columns ``COLUMNS``.

    Copies live in a ``storebench-fuzz-<pid>-*`` directory under ``scratch_dir`` (default:
    the system's temporary directory), removed at the end, on Ctrl-C too; ones left by a
    killed run are removed at the next start.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from .bench.runner import remove_stale_temp_dirs

    for name, value in (("copies_per_dataset", copies_per_dataset), ("workers", workers),
                        ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    remove_stale_temp_dirs(FUZZ_DIR_PREFIX, scratch_dir)
    scratch = Path(tempfile.mkdtemp(prefix=f"{FUZZ_DIR_PREFIX}{os.getpid()}-", dir=scratch_dir))
    rows: list[dict] = []
    try:
        targets = fuzz_targets(data_dir, scratch, formats=formats, progress=False)
        copies_dir = scratch / "copies"
        copies_dir.mkdir()
        plan = deque((t, c) for c in range(copies_per_dataset) for t in targets)
        total = len(targets) + 2 * len(plan)
        with KillablePool(workers=workers, timeout_s=timeout_s, log_dir=scratch,
                          memory_limit_bytes=memory_limit_bytes) as pool, \
                tqdm(total=total, desc="fuzz", unit="read", disable=not progress,
                     dynamic_ncols=True) as bar:
            pristine = _read_pristine(pool, targets, batch_size, bar)
            outcomes: Counter = Counter()
            pending: dict[tuple, dict] = {}
            while plan or pool.busy:
                while plan and pool.idle:
                    target, copy = plan.popleft()
                    dest = copies_dir / f"{len(rows) + len(pending)}-{copy}"
                    damage, detail = make_damaged_copy(target, dest, seed=seed, copy=copy)
                    copy_info = {"target": target, "copy": copy, "damage": damage,
                                 "detail": detail, "path": dest, "left": 2}
                    for verify in (True, False):
                        pending[(str(dest), verify)] = copy_info
                        pool.submit((str(dest), verify), read_everything, path=str(dest),
                                    verify=verify, batch_size=batch_size,
                                    expected=pristine[target.name][0])
                for result in pool.results():
                    copy_info = pending.pop(result.key)
                    row = _row(result, copy_info, seed, pristine, scratch)
                    rows.append(row)
                    outcomes[row["outcome"]] += 1
                    copy_info["left"] -= 1
                    if not copy_info["left"]:
                        shutil.rmtree(copy_info["path"], ignore_errors=True)
                    bar.update(1)
                    bar.set_postfix(outcomes, refresh=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.sort_values(["dataset", "copy", "verify"], ascending=[True, True, False],
                             ignore_index=True)


def _read_pristine(pool: KillablePool, targets: Sequence[FuzzTarget], batch_size: int,
                   bar) -> dict[str, tuple[bytes, int]]:
    """name -> (digests, length) of each undamaged dataset, read with verify=True."""
    by_key = {str(t.path): t for t in targets}
    for target in targets:
        pool.submit(str(target.path), read_everything, path=str(target.path), verify=True,
                    batch_size=batch_size)
    pristine = {}
    while pool.busy:
        for result in pool.results():
            target = by_key[result.key]
            report = result.value
            if result.status != "ok" or report.dataset_errors or report.other_errors \
                    or report.wrong:
                why = (result.error or report.other_error[1] or report.dataset_error[1]
                       or f"{report.wrong} samples differ between read_many and reader[i]")
                raise DatasetError(
                    f"{target.path}: the undamaged dataset does not read back cleanly "
                    f"({result.status}): {why}")
            pristine[target.name] = (report.digests, report.length)
            bar.update(1)
    return pristine


def _row(result: TaskResult, copy_info: dict, seed: int,
         pristine: dict[str, tuple[bytes, int]], scratch: Path) -> dict:
    target: FuzzTarget = copy_info["target"]
    path, verify = result.key
    if result.status == "ok":
        report: ReadReport = result.value
        outcome, exception, message = classify(report, pristine[target.name][1])
        wrong = report.wrong
    elif result.status == "error":  # the task itself failed: not the reader's doing
        outcome, exception, message, wrong = "other_error", "fuzz", result.error, 0
    else:
        outcome, exception, wrong = result.status, result.error, 0
        message = result.log
    return {
        "dataset": target.name,
        "format": target.format,
        "encoding": target.encoding,
        "damage": copy_info["damage"],
        "detail": copy_info["detail"],
        "verify": verify,
        "seed": seed,
        "copy": copy_info["copy"],
        "outcome": outcome,
        "exception": exception,
        "message": _clean_message(message, {path: "<copy>", str(scratch): "<scratch>"}),
        "names_file": bool(exception) and outcome != "crash" and outcome != "hang"
        and path in message,
        "wrong_samples": wrong,
        "seconds": result.seconds,
    }


# ---------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------
def summarise(df: pd.DataFrame, by: Sequence[str] = ("format", "damage", "verify")
              ) -> pd.DataFrame:
    """Counts of each outcome (columns, in ``OUTCOMES`` order) per ``by`` group."""
    table = df.groupby(list(by))["outcome"].value_counts().unstack(fill_value=0)
    return table.reindex(columns=list(OUTCOMES), fill_value=0).astype(int)


def violations(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that break the bar: any hang or crash, any error that is not a DatasetError,
    any silently wrong sample with verify=True, and with verify=False where the format's own
    checks or the file-identity check should have seen the damage."""
    catchable = np.array([catchable_without_verify(f, d)
                          for f, d in zip(df["format"], df["damage"])], dtype=bool)
    silent = df["outcome"] == "silent_wrong"
    bad = (df["outcome"].isin(["hang", "crash", "other_error"])
           | (silent & df["verify"]) | (silent & ~df["verify"] & catchable))
    return df[bad]


def fuzz_command(data_dir: Path | str, *, copies_per_dataset: int = 50, seed: int = 0,
                 out: Path | str | None = None, timeout_s: float = 30.0, workers: int = 2,
                 formats: Sequence[str] | None = None, progress: bool = True,
                 echo: Callable[[str], None] = print) -> int:
    """``storebench fuzz``: run, write the rows to ``out`` (CSV), print the summary and the
    violations. Returns the exit code: 1 if anything breaks the bar, else 0."""
    import pandas as pd

    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"{data_dir}: no such directory")
    if out is not None:
        out = Path(out)
        if out.is_dir():
            raise ValueError(f"--out {out}: is a directory, expected a CSV file path")
        if not os.access(out.parent if str(out.parent) else Path("."), os.W_OK):
            raise ValueError(f"--out {out}: cannot write in {out.parent}")
    df = run_fuzz(data_dir, copies_per_dataset=copies_per_dataset, seed=seed,
                  timeout_s=timeout_s, workers=workers, formats=formats, progress=progress)
    if out is not None:
        df.to_csv(out, index=False)
        echo(f"{out}: {len(df)} rows")
    with pd.option_context("display.max_rows", None, "display.width", 200):
        echo(summarise(df).to_string())
        echo("")
        echo(summarise(df, by=("verify",)).to_string())
    bad = violations(df)
    if len(bad):
        echo(f"\n{len(bad)} of {len(df)} reads break the bar:")
        with pd.option_context("display.max_rows", None, "display.width", 200):
            echo(summarise(bad, by=("format", "encoding", "damage", "verify")).to_string())
        return 1
    echo(f"\nall {len(df)} reads meet the bar")
    return 0

