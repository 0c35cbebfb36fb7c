"""Test-load downloaded model files in a separate process: `python -m edge_agent.fleet.probe FILE...`.

A corrupt or hostile ONNX file can crash onnxruntime's whole process
(onnxruntime #4349), so the daemon never loads an untrusted model in its own
process first. Exit 0: every file loads; 2: one does not (the reason on
stderr); killed by a signal: onnxruntime crashed on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from edge_agent.errors import EdgeError
from edge_agent.runtime.sessions import make_session


def probe(path: Path) -> dict[str, object]:
    if path.suffix == ".onnx":
        session = make_session(path, 1, spin=False)
        return {"file": path.name, "inputs": [i.name for i in session.get_inputs()],
                "outputs": [o.name for o in session.get_outputs()]}
    if path.suffix == ".json":
        with path.open("rb") as fh:
            json.load(fh)
    return {"file": path.name}


def main(argv: list[str]) -> int:
    results = []
    for arg in argv:
        try:
            results.append(probe(Path(arg)))
        except (EdgeError, ValueError, OSError) as exc:
            print(f"{Path(arg).name}: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
