"""`announce/` is trigger-neutral: it must not reach into any transport."""

import ast
from pathlib import Path

import edge_agent.announce

PACKAGE = Path(edge_agent.announce.__file__).parent


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


def test_announce_imports_nothing_from_mqtt():
    files = sorted(PACKAGE.glob("*.py"))
    assert {f.name for f in files} >= {"message.py", "journal.py", "queue.py", "playout.py", "pipeline.py"}
    offenders = {f.name: sorted(m for m in imported_modules(f)
                                if m.startswith(("edge_agent.mqtt", "paho")))
                 for f in files}
    assert {name: mods for name, mods in offenders.items() if mods} == {}
