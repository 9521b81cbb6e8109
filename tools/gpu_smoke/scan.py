"""Whether a secret's bytes are anywhere in some files: the server's log, vLLM's caches.

Files are read in chunks (:data:`CHUNK`), each searched together with the last ``len(secret) - 1`` bytes of the one
before it, so a secret split across two chunks is found and a large cache is never read whole. Only files modified
since ``since`` are read where it is given: a fresh token can be in no older file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Finding:
    """Where the secret is: the file and the offset of its first byte there."""

    path: Path
    offset: int


def find_in_file(path: Path, secret: bytes, chunk: int = CHUNK) -> int | None:
    """The offset of the first occurrence of ``secret`` in ``path``, else None (also for a file that cannot be
    read: it vanished, or is a socket)."""
    if not secret:
        raise ValueError("an empty secret is in every file")
    keep = len(secret) - 1
    tail = b""
    consumed = 0  # bytes of the file before ``tail``
    try:
        with path.open("rb") as handle:
            while block := handle.read(max(chunk, 1)):
                window = tail + block
                at = window.find(secret)
                if at >= 0:
                    return consumed + at
                cut = max(len(window) - keep, 0)
                consumed += cut
                tail = window[cut:]
    except OSError:
        return None
    return None


def files_under(roots: Iterable[Path], since: float | None = None) -> Iterator[Path]:
    """The regular files under ``roots`` (each a directory or a file; missing ones are skipped), symbolic links
    not followed; with ``since``, only those modified at or after it (seconds since the epoch)."""
    for root in roots:
        if root.is_file() and not root.is_symlink():
            candidates: Iterable[Path] = [root]
        elif root.is_dir():
            candidates = (Path(d) / f for d, _dirs, names in os.walk(root) for f in names)
        else:
            continue
        for path in candidates:
            try:
                info = path.lstat()
            except OSError:
                continue
            if path.is_symlink() or not path.is_file():
                continue
            if since is None or info.st_mtime >= since:
                yield path


def scan(
    roots: Iterable[Path], secret: str, since: float | None = None, chunk: int = CHUNK
) -> tuple[int, list[Finding]]:
    """How many files were read, and every one that holds ``secret`` (UTF-8)."""
    needle = secret.encode()
    read = 0
    found = []
    for path in files_under(roots, since):
        read += 1
        at = find_in_file(path, needle, chunk)
        if at is not None:
            found.append(Finding(path, at))
    return read, found
