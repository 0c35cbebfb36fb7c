import json
import pkgutil
import subprocess
import sys

import edge_agent

PROBE = """
import importlib, json, pkgutil, sys
import edge_agent
names = [m.name for m in pkgutil.walk_packages(edge_agent.__path__, "edge_agent.")
         if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": len(names), "torch": "torch" in sys.modules,
                  "whisper": "whisper" in sys.modules, "silero_vad": "silero_vad" in sys.modules}))
"""


def test_no_device_module_imports_torch_whisper_or_silero_vad():
    assert len(list(pkgutil.walk_packages(edge_agent.__path__, "edge_agent."))) > 20
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                            check=True)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"modules": found["modules"], "torch": False, "whisper": False, "silero_vad": False}
