"""Child processes that die with the process that started them (Linux parent-death signal)."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

_LIBC = ctypes.CDLL(None, use_errno=True) if hasattr(ctypes, "CDLL") else None
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A `preexec_fn` that has the kernel SIGKILL the child when its parent dies.

    The signal follows the *thread* that forked: spawn from a thread that lives as long as the
    parent process (the main thread), not from a short-lived worker. Only prctl and getppid run
    between fork and exec, so there is no lock to deadlock on.
    """

    def preexec() -> None:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        # The parent may have died between fork and prctl.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec
