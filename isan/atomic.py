"""Atomic file and directory writes: write to a temporary sibling, then rename.

A directory is built in a hidden sibling ``.NAME.partial-PID@HOST-XXXXXXXX`` and renamed onto
``NAME`` when complete. A process killed mid-write leaves that sibling behind; the next write to
the same place removes it (:func:`remove_stale_partials`): at once when the process that made it
is gone (same host), otherwise once it is older than :data:`STALE_SECONDS`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

#: a leftover partial directory of another host (or of unknown owner) is removed after this long
STALE_SECONDS = 3600.0


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())[:64] or "host"


def owner_tag() -> str:
    """``PID@HOST`` of this process, as embedded in temporary directory names."""
    return f"{os.getpid()}@{_host()}"


def pid_alive(pid: int) -> bool:
    """Whether a process of this number runs on this host (one we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _is_stale(entry: Path, kind: str, name: str, max_age: float) -> bool:
    m = re.fullmatch(rf"\.{re.escape(name)}\.{kind}-(\d+)@([A-Za-z0-9_.]+)-.+", entry.name)
    if m and m.group(2) == _host():
        pid = int(m.group(1))
        return pid != os.getpid() and not pid_alive(pid)
    try:
        age = time.time() - entry.lstat().st_mtime
    except FileNotFoundError:
        return False
    return age > max_age


def remove_stale_partials(path: str | os.PathLike, max_age: float = STALE_SECONDS) -> list[Path]:
    """Remove leftover ``.NAME.partial-*`` and ``.NAME.old-*`` directories beside ``path``.

    A leftover is removed when the process that made it (same host) is no longer running, or,
    for another host or an untagged name, when it is older than ``max_age`` seconds.
    Returns the removed paths.
    """
    path = Path(path)
    removed = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        for kind in ("partial", "old"):
            if entry.name.startswith(f".{path.name}.{kind}-") and entry.is_dir() and not entry.is_symlink():
                if _is_stale(entry, kind, path.name, max_age):
                    shutil.rmtree(entry, ignore_errors=True)
                    if not entry.exists():
                        log.info("removed the leftover %s", entry)
                        removed.append(entry)
    return removed


def make_partial_dir(path: str | os.PathLike) -> Path:
    """A new empty hidden sibling ``.NAME.partial-PID@HOST-XXXXXXXX`` of ``path`` (stale ones removed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-{owner_tag()}-", dir=path.parent))


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode("utf-8"))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    Works for a file that a library writes by name (e.g. ``safetensors.save_file``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; on success it replaces ``path``.

    An interrupted write leaves only a hidden ``.NAME.partial-*`` directory, never a
    directory at ``path`` that looks complete; the next write to ``path`` removes such
    leftovers (:func:`remove_stale_partials`).

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass --overwrite to replace it")
    tmp = make_partial_dir(path)
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-{owner_tag()}-", dir=path.parent))
            os.rmdir(old)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
