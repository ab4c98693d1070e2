"""Which files this user built or verified here: the trust record for trusted-input-only files.

Some readers cannot be made safe on a crafted file. LMDB reads values straight out of a
memory map and trusts the B-tree it finds there: two bytes changed in a leaf node's size field
make a read touch pages past the end of the file, and the process dies with SIGBUS before any
check of ours can run. A whole-file checksum in the manifest would not help against intent
(anyone can recompute it, as they can the manifest's digest), so the defence is provenance:

- a build marks each such file it writes as trusted;
- ``storebench verify`` reads an untrusted one in a separate process (a SIGBUS there is a
  failed verify, not a dead command) and marks it trusted when every sample matches;
- ``open_dataset`` refuses an untrusted one unless asked with ``trust=True``.

A mark is an empty file named by the file's identity: device, inode, size, and modification
and change times in nanoseconds. Any write, copy, rename onto it or ``touch`` changes the
change time (which no user can set), so a mark never vouches for bytes that were not the
ones built or verified. Marks live in ``$STOREBENCH_STATE_DIR`` (default
``$XDG_STATE_HOME/storebench``, else ``~/.local/state/storebench``), under ``trusted/``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

STATE_DIR_ENV = "STOREBENCH_STATE_DIR"


def state_dir() -> Path:
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"),
                                                            ".local", "state")
    return Path(base) / "storebench"


def file_identity(path: Path | str) -> str | None:
    """A digest of ``path``'s device, inode, size, mtime and ctime; None if it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    text = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    return hashlib.sha256(text.encode()).hexdigest()


def _mark(path: Path | str) -> Path | None:
    identity = file_identity(path)
    return None if identity is None else state_dir() / "trusted" / identity


def is_trusted(path: Path | str) -> bool:
    mark = _mark(path)
    return mark is not None and mark.is_file()


def mark_trusted(path: Path | str) -> bool:
    """Record ``path``, as it is now, as built or verified by this user; False where the
    state directory cannot be written (the file then stays untrusted: safe, not fatal)."""
    mark = _mark(path)
    if mark is None:
        return False
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
    except OSError:
        return False
    return True
