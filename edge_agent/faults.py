"""Crash points for fault tests: the process kills itself with SIGKILL at a named step.

`EDGE_AGENT_CRASH_AT=fleet:renamed edge-agent run ...` dies right after the active
config file is renamed into place, exactly as a power cut there would leave it.
Unset (always, in production) each point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "EDGE_AGENT_CRASH_AT"


def crash_point(name: str) -> None:
    """SIGKILL this process if `$EDGE_AGENT_CRASH_AT` names this point."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
