"""Imported by the fork server alone (``preload.PRELOAD``): it dies at once with the driver that
started it (PR_SET_PDEATHSIG), so that its ranks, which die with it, die with the driver as a
started rank does, before a rank could take the driver's closed connections for a failure of its
own. Nothing else imports it."""

from __future__ import annotations

import ctypes
import signal

from sweepbench.launch.rank import PR_SET_PDEATHSIG

try:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
except (OSError, AttributeError):  # not Linux: the fork server still exits when the driver's pipe closes
    pass
