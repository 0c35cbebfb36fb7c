"""`wake/` hears on its own: it imports neither the VAD, the ASR, the voice nor any transport."""

import ast
from pathlib import Path

import edge_agent.wake

PACKAGE = Path(edge_agent.wake.__file__).parent
FORBIDDEN = ("edge_agent.vad", "edge_agent.asr", "edge_agent.tts", "edge_agent.mqtt", "edge_agent.announce")


def test_wake_imports_no_other_hearing_or_speaking_package():
    offenders = {}
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.startswith(FORBIDDEN)]
            if bad:
                offenders[path.name] = bad
    assert offenders == {}
