"""The package rules of docs/architecture.md, checked over every import in `edge_agent/` and `tools/`.

Imports are read with `ast`, at module level and inside functions alike (a function-level import is
still a dependency, only a hidden one), relative ones resolved. The rules: no import cycle among
edge_agent modules; `audio/` is the ground and imports nothing of ours but its own types, settings
(`audio/settings.py`, not `config`) and errors; hearing (`asr/`, `vad/`, `wake/`) and speaking
(`tts/`) do not import each other, and `wake/` hears on its own (no VAD, ASR, voice or transport);
`text/` imports only itself; `announce/` knows no transport and no trigger; the Wyoming, Hermes,
Home Assistant and ESPHome adapters do not import each other, nor does the MQTT transport import
them, and no adapter reads another package's internals (a `_private` name); the exporter and the
benchmarks live beside the runtime (`tools/`, a distribution of their own), and the runtime never
imports them nor torch; the benchmarks reach the exporter only through entry points. `offload/` is
cut by side: the wire format imports neither side (and of ours only `audio/` and `errors`), the
client and server sides do not import each other, and the rest of the package reaches offload only
through its public side packages (`edge_agent/offload/__init__.py` says why).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HEARING = ("asr", "vad", "wake")
SPEAKING = ("tts",)
ADAPTERS = ("wyoming", "hermes", "homeassistant", "esphome", "sendspin")
"""Triggers beside the MQTT transport: each calls `announce/` and the listener, never another adapter."""
FLOWS = (*HEARING, *SPEAKING, "listen", "mqtt", *ADAPTERS, "announce", "offload", "fleet",
         "commands", "daemon", "cli")
OFFLOAD = "edge_agent.offload"
WIRE, CLIENT, SERVER = (f"{OFFLOAD}.{side}" for side in ("wire", "client", "server"))
OFFLOAD_PUBLIC = frozenset({OFFLOAD, WIRE, CLIENT, SERVER, f"{OFFLOAD}.settings"})
"""What code outside `offload/` may import: the side packages, whose `__all__` are the entry points,
and the settings sections (`config` assembles them without loading either side)."""
GROUND = ("audio", "errors", "homes")
"""All `audio/` may import of ours: itself (its settings are `audio/settings.py`), the errors, and
where state lives by default (`homes`); not `config`, which assembles everything above it."""
TOOLS = ("exporters", "benchmarks")
"""Beside the runtime in tools/ (their own distribution): the device wheel ships neither."""
NEVER = (*TOOLS, "torch", "torchaudio", "whisper", "silero_vad")
"""Top-level packages the runtime must not import: the exporter and the benchmarks, and what pulls
torch in (openai-whisper's `whisper`, the `silero_vad` package; the runtime reads Silero's ONNX file)."""
FLOORS = (
    ("edge_agent", "errors", "homes", "faults", "atomic", "checks", "endpoints", "typedtree", "safeyaml",
     "logs", "text", "audio", "device", "netclose", "mdns", "metrics", "controls", "runtime",
     "threads", "lazy"),
    ("models",),
    ("vad", "wake", "asr", "tts"),
    ("listen", "announce", "offload", "fleet"),
    ("mqtt",),
    ADAPTERS,
    ("config",),
    ("parts", "outputs", "services", "status", "reload", "listener", "daemon", "commands", "cli",
     "configref", "__main__"),
)
"""The floors of `edge_agent`, ground first: a module imports its own floor and those below, never
one above. The ground holds what every flow shares (audio, text, errors, where state lives, the
runtime's providers); then the model store; hearing and speaking; the flows built on them (the
listener, the announcer, offload, the fleet); the MQTT transport; the adapters beside it;
`config`, which assembles every package's settings section; and the wiring (`parts` loads the
models the adapters are handed, `outputs` the voice's sinks, `services` starts the servers,
`status`, `reload` and `listener` are the daemon's, `daemon` connects them, the commands). Every
package has a floor: a new one must be placed here."""
WIRING = FLOORS[-1]
"""The only floor that imports `config` (the whole `Settings`): below it each package is handed its
own section."""


def floor(module: str) -> int:
    """The floor of an `edge_agent` module (by its package, or its own name at the top level)."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "edge_agent"
    for level, names in enumerate(FLOORS):
        if name in names:
            return level
    raise AssertionError(f"{module}: no floor in FLOORS (place its package there)")


def upward(deps: dict[str, set[str]]) -> dict[str, list[str]]:
    """Modules importing an `edge_agent` module on a higher floor than their own, with what they import."""
    bad = {name: sorted(d for d in targets if within(d, "edge_agent") and floor(d) > floor(name))
           for name, targets in deps.items()}
    return {name: found for name, found in bad.items() if found}


def package_cycles(deps: dict[str, set[str]], depth: int = 2) -> list[list[str]]:
    """Import cycles among folders (the first `depth` parts of each name: `edge_agent.asr`), which
    a cycle-free module graph may still have (asr.x -> config -> asr.settings)."""
    folders: dict[str, set[str]] = {}
    for name, targets in deps.items():
        mine = ".".join(name.split(".")[:depth])
        folders.setdefault(mine, set()).update(
            ".".join(d.split(".")[:depth]) for d in targets if within(d, "edge_agent"))
    for name, targets in folders.items():
        targets.discard(name)
    return cycles(folders)


KNOWN_INTERNALS = {"edge_agent.homeassistant.discovery": ["t._own"]}
"""Breaches of the internals rule found when it was written, left to their owners: each must still
be real (so a fix removes its entry), and no new one may appear."""


def modules(root: Path, package: str = "edge_agent") -> dict[str, Path]:
    """Dotted module name -> file, for every module of `package` under `root`."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module `name` imports, anywhere in the file; `from pkg import sub` counts as `pkg.sub`."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                out.add(sub if sub in known else module)
    out.discard(name)
    return out


def graph(root: Path, package: str = "edge_agent") -> dict[str, set[str]]:
    known = modules(root, package)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(deps: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(deps):
        if start in index:
            continue
        work = [(start, iter(sorted(d for d in deps[start] if d in deps)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(d for d in deps[child] if d in deps))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def offenders(deps: dict[str, set[str]], package: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """Modules of `package` that import something under one of `forbidden`, with what they import."""
    bad = {name: sorted(d for d in targets if any(within(d, f) for f in forbidden))
           for name, targets in deps.items() if within(name, package)}
    return {name: found for name, found in bad.items() if found}


def reaching_inside(deps: dict[str, set[str]], package: str, public: frozenset[str],
                    exempt: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Modules outside `package` (and `exempt`) importing a module of it that is not in `public`."""
    bad = {name: sorted(d for d in targets if within(d, package) and d not in public)
           for name, targets in deps.items()
           if not within(name, package) and not any(within(name, e) for e in exempt)}
    return {name: found for name, found in bad.items() if found}


def beyond(deps: dict[str, set[str]], package: str, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    """Modules of `package` that import any edge_agent module outside `allowed`, with what they import."""
    bad = {name: sorted(d for d in targets
                        if within(d, "edge_agent") and not any(within(d, ok) for ok in allowed))
           for name, targets in deps.items() if within(name, package)}
    return {name: found for name, found in bad.items() if found}


def ours(*names: str) -> tuple[str, ...]:
    return tuple(f"edge_agent.{n}" for n in names)


DEPS = graph(ROOT)
TOOL_DEPS = {name: deps for package in TOOLS for name, deps in graph(ROOT / "tools", package).items()}


def private_reads(root: Path, package: str) -> dict[str, list[str]]:
    """Modules of `package` that reach into another package: a `_name` imported from one, or an
    attribute `x._name` read on anything but `self`/`cls` (an object another package made)."""
    found: dict[str, list[str]] = {}
    for name, path in modules(root).items():
        if not within(name, package):
            continue
        reads = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level \
                    and not within(node.module, package):
                reads += [f"{node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and ast.unparse(node.value) not in ("self", "cls"):
                reads.append(f"{ast.unparse(node.value)}.{node.attr}")
        if reads:
            found[name] = sorted(set(reads))
    return found


def test_the_walk_sees_the_whole_package():
    assert {"edge_agent.audio.frames", "edge_agent.announce.pipeline", "edge_agent.text.wer"} <= set(DEPS)
    assert "edge_agent.audio.frames" in DEPS["edge_agent.tts.voice"]


def test_no_import_cycle_among_edge_agent_modules():
    assert cycles(DEPS) == []


def test_no_import_cycle_among_edge_agent_folders():
    assert package_cycles(DEPS) == []


def test_every_module_has_a_floor_and_none_imports_from_a_higher_one():
    assert {floor(name) for name in DEPS} == set(range(len(FLOORS)))
    assert upward(DEPS) == {}


def test_below_the_wiring_no_module_imports_config():
    below = tuple(n for n in DEPS if floor(n) < len(FLOORS) - 1)
    assert {name: found for name, found in offenders(DEPS, "edge_agent", ("edge_agent.config",)).items()
            if name in below} == {}


MAX_CLASS_LINES = 300
"""A class longer than this holds several jobs: cut it into named units."""


def test_no_class_holds_more_than_one_screenful_of_jobs():
    long = {}
    for name, path in modules(ROOT).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long[f"{name}.{node.name}"] = lines
    assert long == {}


def test_one_listening_loop():
    """The hearing loop (`listen.loop`) is the only pump from audio to transcripts: asr recognises an
    utterance and drives nothing."""
    pumps = sorted(name for name, targets in DEPS.items() if "edge_agent.audio.pump" in targets)
    assert pumps == ["edge_agent.listen.loop"]
    assert offenders(DEPS, "edge_agent.asr", ours("listen", "audio.pump", "audio.sources")) == {}


def test_audio_is_the_ground_and_imports_only_its_own_types_settings_and_errors():
    assert beyond(DEPS, "edge_agent.audio", ours(*GROUND)) == {}


def test_hearing_and_speaking_do_not_import_each_other():
    assert offenders(DEPS, "edge_agent.tts", ours(*HEARING)) == {}
    for package in HEARING:
        assert offenders(DEPS, f"edge_agent.{package}", ours(*SPEAKING)) == {}


def test_wake_word_detection_hears_on_its_own():
    assert offenders(DEPS, "edge_agent.wake", ours("vad", "asr", "tts", "mqtt", "announce")) == {}


def test_text_is_shared_ground_and_imports_only_itself():
    outside = tuple(n for n in DEPS if n != "edge_agent" and not within(n, "edge_agent.text"))
    assert offenders(DEPS, "edge_agent.text", outside) == {}


def test_announce_imports_no_transport_and_no_trigger():
    assert offenders(DEPS, "edge_agent.announce", (*ours("mqtt", *ADAPTERS), "paho")) == {}


def test_adapters_do_not_import_each_other_and_the_mqtt_transport_none_of_them():
    for adapter in ADAPTERS:
        assert offenders(DEPS, f"edge_agent.{adapter}", ours(*(a for a in ADAPTERS if a != adapter))) == {}
    assert offenders(DEPS, "edge_agent.mqtt", ours(*ADAPTERS)) == {}


def test_no_adapter_reads_another_package_s_internals():
    found = {}
    for adapter in ADAPTERS:
        found.update(private_reads(ROOT, f"edge_agent.{adapter}"))
    assert found == KNOWN_INTERNALS


def test_the_runtime_never_imports_the_exporter_the_benchmarks_or_torch():
    assert offenders(DEPS, "edge_agent", NEVER) == {}


def test_the_offload_wire_format_imports_neither_side_and_of_ours_only_audio_and_errors():
    assert offenders(DEPS, WIRE, (CLIENT, SERVER)) == {}
    allowed = (WIRE, "edge_agent.audio", "edge_agent.errors")
    # Everything of ours but those, and but the packages holding `wire/` (`edge_agent`, `offload`).
    outside = tuple(n for n in DEPS if not within(WIRE, n) and not any(within(n, a) for a in allowed))
    assert offenders(DEPS, WIRE, outside) == {}


def test_the_offload_client_and_server_sides_do_not_import_each_other():
    assert offenders(DEPS, CLIENT, (SERVER,)) == {}
    assert offenders(DEPS, SERVER, (CLIENT,)) == {}


def test_outside_offload_only_its_public_side_packages_are_imported():
    assert reaching_inside(DEPS, OFFLOAD, OFFLOAD_PUBLIC) == {}


def test_each_offload_side_names_its_entry_points_and_they_import():
    import importlib

    for side in (WIRE, CLIENT, SERVER):
        module = importlib.import_module(side)
        assert module.__all__, side
        assert all(hasattr(module, name) for name in module.__all__), side
def test_the_exporter_and_the_benchmarks_live_beside_the_runtime_package():
    assert not [p for p in (ROOT / "edge_agent").iterdir() if p.name in ("bench", *TOOLS)]
    assert {"benchmarks.asr", "benchmarks.clips", "exporters.cli"} <= set(TOOL_DEPS)
    assert "edge_agent.commands.bench" in DEPS  # the verb stays; what it runs is found by entry point


def test_the_benchmarks_reach_the_exporter_only_through_entry_points():
    assert offenders(TOOL_DEPS, "benchmarks", ("exporters", "torch", "whisper")) == {}


def test_the_rules_catch_hidden_relative_and_cyclic_imports(tmp_path: Path):
    pkg = tmp_path / "edge_agent"
    (pkg / "audio").mkdir(parents=True)
    (pkg / "tts").mkdir()
    for init in (pkg, pkg / "audio", pkg / "tts"):
        (init / "__init__.py").write_text("")
    (pkg / "audio" / "play.py").write_text("def play():\n    from ..tts import voice\n")
    (pkg / "tts" / "voice.py").write_text("from edge_agent.audio import play\nimport torch.nn\n")
    deps = graph(tmp_path)
    assert deps["edge_agent.audio.play"] == {"edge_agent.tts.voice"}
    assert cycles(deps) == [["edge_agent.audio.play", "edge_agent.tts.voice"]]
    found = offenders(deps, "edge_agent.audio", ours("tts"))
    assert found == {"edge_agent.audio.play": ["edge_agent.tts.voice"]}
    assert beyond(deps, "edge_agent.audio", ours(*GROUND)) == found
    assert offenders(deps, "edge_agent", NEVER) == {"edge_agent.tts.voice": ["torch.nn"]}


def test_the_floor_rules_catch_an_upward_import_and_a_folder_cycle(tmp_path: Path):
    pkg = tmp_path / "edge_agent"
    for folder in ("asr", "config"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "asr" / "settings.py").write_text("")
    (pkg / "asr" / "transcriber.py").write_text("from edge_agent.config.load import Settings\n")
    (pkg / "config" / "load.py").write_text("from edge_agent.asr.settings import AsrSettings\n")
    deps = graph(tmp_path)
    assert cycles(deps) == []  # no module cycle: the folders make one
    assert package_cycles(deps) == [["edge_agent.asr", "edge_agent.config"]]
    assert upward(deps) == {"edge_agent.asr.transcriber": ["edge_agent.config.load"]}


def test_the_public_rule_catches_a_reach_into_an_offload_module(tmp_path: Path):
    pkg = tmp_path / "edge_agent"
    (pkg / "offload" / "client").mkdir(parents=True)
    (pkg / "wyoming").mkdir()
    for init in (pkg, pkg / "offload", pkg / "offload" / "client", pkg / "wyoming"):
        (init / "__init__.py").write_text("")
    (pkg / "offload" / "client" / "router.py").write_text("")
    (pkg / "offload" / "client" / "__init__.py").write_text("from .router import make\n")
    (pkg / "wyoming" / "ok.py").write_text("from edge_agent.offload.client import make\n")
    hidden = "def f():\n    from edge_agent.offload.client.router import make\n"
    (pkg / "wyoming" / "tts.py").write_text(hidden)
    deps = graph(tmp_path)
    found = reaching_inside(deps, OFFLOAD, OFFLOAD_PUBLIC)
    assert found == {"edge_agent.wyoming.tts": ["edge_agent.offload.client.router"]}
    assert reaching_inside(deps, OFFLOAD, OFFLOAD_PUBLIC, ("edge_agent.wyoming",)) == {}
def test_the_internals_rule_catches_private_imports_and_reads(tmp_path: Path):
    pkg = tmp_path / "edge_agent"
    (pkg / "wyoming").mkdir(parents=True)
    (pkg / "wyoming" / "server.py").write_text(
        "from edge_agent.announce.queue import _Entry\n"
        "from edge_agent.wyoming.events import _local\n"
        "def f(announcer, self):\n    return announcer._queue, self._own, announcer.__class__\n")
    assert private_reads(tmp_path, "edge_agent.wyoming") == {
        "edge_agent.wyoming.server": ["announcer._queue", "edge_agent.announce.queue._Entry"]}


def test_no_import_cycle_among_the_benchmarks():
    """A bench that shares a piece with another takes it from a module both import (`echo`,
    `livemic`, `peers`, `wake`'s noises), never from the other bench, which may dispatch to it."""
    benchmarks = {name: deps for name, deps in TOOL_DEPS.items() if within(name, "benchmarks")}
    assert cycles(benchmarks) == []
