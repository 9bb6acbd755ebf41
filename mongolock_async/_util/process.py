"""Child processes that do not outlive the process that started them."""

from __future__ import annotations

import ctypes
import os
import signal
import sys


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """``preexec_fn`` for a child that gets SIGKILL when its parent dies, however the parent ends.

    Linux's PR_SET_PDEATHSIG follows the *thread* that forked: fork from the main thread. The child
    also gets a process group of its own, so a Ctrl-C at the terminal reaches only the parent, which
    then stops its children cleanly.
    """
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    os.setpgrp()
