"""Hostile-input kinds for ``storebench fuzz``: what a dataset handed over by someone else may
hold on purpose, not by accident (docs/security.md).

Each kind is ``apply(root, target, rng) -> detail`` on a copy at ``root``, like the corruption
kinds in ``storebench.fuzz``, and applies to every format: it works on the manifest and the
files it lists, never on a format's internals. Unlike damage, which a reader may find harmless
(a flipped padding byte), every hostile kind must be refused: a read that returns samples
from a copy with a name leading out of it, a FIFO or a device in it, or a manifest claiming
10**12 samples, breaks the bar even when the samples are right. The fuzzer's workers run
with a memory limit and a time limit, so an unbounded allocation or a hang is counted, not
suffered.

Where a kind points out of the copy, it points at a file placed beside the copy with the
very bytes the dataset expects (``OUTSIDE_PREFIX``): a reader that follows the name reads
correct samples, and only confinement can tell.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .formats.manifest import CHECKSUMS_NAME, MANIFEST_NAME, manifest_digest

# A file of the right bytes placed outside the copy, next to it: ``outside-<name>``.
OUTSIDE_PREFIX = "outside-"
HUGE_SAMPLES = 10**12
HUGE_SIDE = 1 << 20  # a 2**20 x 2**20 image: 3 TiB of raw pixels
MANIFEST_NESTING = 200_000


def _files(target) -> list[str]:
    return sorted(target.files)


def _pick(names: list[str], rng: np.random.Generator) -> str:
    return names[int(rng.integers(len(names)))]


def _outside_copy(root: Path, rel: str) -> Path:
    """A copy of ``root/rel`` placed beside ``root`` (outside the dataset), named without
    ``root``'s own name, so that a copy made again elsewhere is byte for byte the same."""
    outside = root.parent / f"{OUTSIDE_PREFIX}{rel.replace('/', '_')}"
    shutil.copyfile(root / rel, outside)
    return outside


def _reseal(root: Path, edit: Callable[[dict], str]) -> str:
    """Edit the copy's manifest and recompute its digest, as anyone can (it is unkeyed)."""
    path = root / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    detail = edit(manifest)
    manifest["manifest_digest"] = manifest_digest(manifest)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return f"{MANIFEST_NAME}: {detail}, digest resealed"


def traversal_name(root: Path, target, rng: np.random.Generator) -> str:
    """A listed file renamed in the manifest to a name that leads out of the dataset (a
    ``../`` name, an absolute path, a backslash or NUL name); the file it reaches holds the
    right bytes."""
    rel = _pick(_files(target), rng)
    outside = _outside_copy(root, rel)
    choices = [f"../{outside.name}", str(outside), f"{rel}/../../{outside.name}",
               f"..\\{outside.name}", f"{rel}\0"]
    name = _pick(choices, rng)

    def edit(manifest: dict) -> str:
        for key in ("files", "fingerprints"):
            manifest[key][name] = manifest[key].pop(rel)
        shown = name.replace(str(outside), "/<outside>").replace(outside.name, "<outside>")
        return f"file {rel!r} listed as {shown!r}"

    return _reseal(root, edit)


def symlink_out(root: Path, target, rng: np.random.Generator) -> str:
    """A listed file replaced by a symbolic link to a file outside the dataset with the
    same bytes (absolute or relative link)."""
    rel = _pick(_files(target), rng)
    outside = _outside_copy(root, rel)
    link = root / rel
    link.unlink()
    pointer = str(outside) if rng.integers(2) else os.path.relpath(outside, link.parent)
    link.symlink_to(pointer)
    how = "absolute" if os.path.isabs(pointer) else "relative"
    return f"{rel}: an {how} symbolic link to a copy outside the dataset (the same bytes)"


def fifo(root: Path, target, rng: np.random.Generator) -> str:
    """A listed file, ``checksums.npy`` or the manifest replaced by a FIFO: a read waits
    for a writer that never comes."""
    rel = _pick([*_files(target), CHECKSUMS_NAME, MANIFEST_NAME], rng)
    (root / rel).unlink()
    os.mkfifo(root / rel)
    return f"{rel}: replaced by a FIFO"


def device_link(root: Path, target, rng: np.random.Generator) -> str:
    """A listed file or ``checksums.npy`` replaced by a symbolic link to an endless device."""
    rel = _pick([*_files(target), CHECKSUMS_NAME], rng)
    device = _pick(["/dev/zero", "/dev/urandom"], rng)
    (root / rel).unlink()
    (root / rel).symlink_to(device)
    return f"{rel}: a symbolic link to {device}"


def symlink_loop(root: Path, target, rng: np.random.Generator) -> str:
    """A listed file replaced by a symbolic link to itself, or two links to each other."""
    rel = _pick(_files(target), rng)
    link = root / rel
    link.unlink()
    if rng.integers(2):
        link.symlink_to(link.name)
        return f"{rel}: a symbolic link to itself"
    other = link.with_name(f"{link.name}.loop")
    other.symlink_to(link.name)
    link.symlink_to(other.name)
    return f"{rel}: a symbolic link loop through {other.name}"


def huge_header(root: Path, target, rng: np.random.Generator) -> str:
    """The manifest (resealed) claims 10**12 samples, a 2**20 x 2**20 image, or is nested
    200,000 levels deep: nothing may be sized from it before a real file's size agrees."""
    kind = int(rng.integers(3))
    if kind == 2:
        text = "[" * MANIFEST_NESTING + "]" * MANIFEST_NESTING
        (root / MANIFEST_NAME).write_text(text)
        return f"{MANIFEST_NAME}: a JSON array nested {MANIFEST_NESTING} deep"

    def edit(manifest: dict) -> str:
        spec = manifest["spec"]
        if kind == 0:
            manifest["num_samples"] = spec["num_samples"] = HUGE_SAMPLES
            return f"num_samples -> {HUGE_SAMPLES}"
        spec["height"] = spec["width"] = HUGE_SIDE
        return f"shape -> {HUGE_SIDE} x {HUGE_SIDE}"

    return _reseal(root, edit)


HOSTILE_KINDS: dict[str, Callable] = {
    "traversal_name": traversal_name,
    "symlink_out": symlink_out,
    "fifo": fifo,
    "device_link": device_link,
    "symlink_loop": symlink_loop,
    "huge_header": huge_header,
}
