"""Child process for the crash tests: apply the envelope in PAYLOAD to the device in DIR.

Run with EDGE_AGENT_CRASH_AT=fleet:<step>; the process SIGKILLs itself at that step.
"""

import sys
from pathlib import Path

from tests.mqtt_support import FleetDevice

device = FleetDevice(Path(sys.argv[1]))
report = device.fm.handle(Path(sys.argv[2]).read_bytes())
print(report.state, report.error)
