"""Wake word detection: microWakeWord models (pymicro-wakeword) behind a trigger-neutral engine."""

from __future__ import annotations

from edge_agent.wake.engine import SAMPLE_RATE, Detection, WakeEngine, WakeStats
from edge_agent.wake.models import WakeModelSpec, check_all, resolve

__all__ = ["SAMPLE_RATE", "Detection", "WakeEngine", "WakeModelSpec", "WakeStats", "check_all", "resolve"]
