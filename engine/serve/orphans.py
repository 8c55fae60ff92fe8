"""What ``isan-serve --workers N`` leaves when its parent dies without stopping them (SIGKILL, a crash).

The parent stops its workers and removes its run folder when it ends by a signal it handles; one
killed outright can do neither. So each worker asks the kernel to send it SIGTERM when its parent
ends (:func:`die_with_parent`: ``prctl(PR_SET_PDEATHSIG)`` on Linux, called through ctypes;
elsewhere a thread that watches the parent's pid, as gunicorn's workers compare ``os.getppid()``
with their parent's): it then shuts down gracefully like any worker sent SIGTERM,
and the port is free once every worker has ended. The run folder carries its owner's pid in its
name (:func:`run_dir_prefix`), and the next ``isan-serve --workers`` removes every such folder whose
owner has ended (:func:`remove_stale_run_dirs`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from isan.atomic import pid_alive

log = logging.getLogger("uvicorn.error")

#: ``PR_SET_PDEATHSIG`` of ``<linux/prctl.h>``
PR_SET_PDEATHSIG = 1
#: a run folder: ``isan-serve-<owner pid>-<random>``
_RUN_DIR = re.compile(r"isan-serve-(\d+)-\w+")
#: seconds between two looks at the parent where the kernel cannot be asked (not Linux)
WATCH_EVERY_S = 1.0


def run_dir_prefix() -> str:
    """The prefix of this process's run folder (``tempfile.mkdtemp(prefix=...)``): it names the owner."""
    return f"isan-serve-{os.getpid()}-"


def remove_stale_run_dirs(folder: str | None = None) -> list[str]:
    """Remove the run folders in ``folder`` (default: the temporary folder) whose owner process has
    ended; folders of running servers, and any other folder, are left alone.

    Returns:
        the folders removed (a folder that cannot be removed is skipped, not an error).
    """
    removed = []
    for d in Path(folder or tempfile.gettempdir()).glob("isan-serve-*"):
        m = _RUN_DIR.fullmatch(d.name)
        if m is None or not d.is_dir() or pid_alive(int(m[1])):
            continue
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed.append(str(d))
    if removed:
        log.info("removed %d run folder(s) of isan-serve processes that ended without cleaning up: %s",
                 len(removed), ", ".join(removed))
    return removed


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> str:
    """Have ``sig`` sent to this process when the process ``parent_pid`` (its parent) ends.

    Linux: the kernel sends it (``prctl(PR_SET_PDEATHSIG)``); elsewhere a daemon thread looks at
    the parent's pid every :data:`WATCH_EVERY_S` s. A parent that has already ended gets ``sig``
    sent at once.

    Returns:
        how: ``"prctl"`` or ``"watch"``.
    """
    how = "watch"
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0:
                how = "prctl"
        except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
            pass
    if how == "watch":
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(WATCH_EVERY_S)
            os.kill(os.getpid(), sig)

        threading.Thread(target=watch, name="isan-parent-watch", daemon=True).start()
    elif os.getppid() != parent_pid:  # it ended before the kernel was asked
        os.kill(os.getpid(), sig)
    return how
