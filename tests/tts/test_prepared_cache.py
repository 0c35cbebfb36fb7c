"""The prepared-voice cache shared by versions and processes: each version's copy is its own, and
nothing another process holds is removed (real files, a real second process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from edge_agent.runtime.sessions import cpu_fingerprint
from edge_agent.tts import inuse, vits
from edge_agent.tts.piper import PiperVoice

VOICE = "en_US-joe-medium"
OLD, NEW = "ort1.31.0-x86_64-test", "ort1.32.0-x86_64-test"
"""Two onnxruntime versions' fingerprints (the files are real optimized copies for this CPU)."""




class OtherProcess:
    """A second Python process that holds `directory` (as a process of its version using it does)
    until told to go on, then runs `then` and exits."""

    def __init__(self, directory: Path, then: str = "") -> None:
        code = textwrap.dedent(f"""
            import sys
            from pathlib import Path
            from edge_agent.tts import inuse
            held = inuse.hold(Path({str(directory)!r}))
            print("held" if held else "missing", flush=True)
            sys.stdin.readline()
        """) + textwrap.dedent(then) + 'print("done", flush=True)\n'
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "held"

    def go_on(self, timeout: float = 60) -> str:
        out, _ = self.proc.communicate("\n", timeout=timeout)
        assert self.proc.returncode == 0
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def files_in(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in directory.iterdir()}


def test_preparing_under_another_version_leaves_the_copy_a_process_of_the_first_is_using(
        prepared: vits.Prepared) -> None:
    old = vits.prepare_cpu(prepared, OLD)
    assert old is not None
    before = files_in(old.directory)
    user = OtherProcess(old.directory, then=f"""
        from edge_agent.runtime.sessions import load_weights, make_session
        front = Path({str(old.front)!r})  # the pooled front, made from the files on first need
        make_session(front, 1, weights=load_weights(front), optimized=True)
        print("made a session", flush=True)
    """)
    try:
        new = vits.prepare_cpu(prepared, NEW)
        assert new is not None and new.directory != old.directory
        assert files_in(old.directory) == before
        assert "made a session" in user.go_on()
    finally:
        user.kill()
    assert {f"cpu-{OLD}", f"cpu-{NEW}"} <= {p.name for p in prepared.directory.glob("cpu-*")}


def test_a_copy_is_removed_only_when_no_process_holds_it(prepared: vits.Prepared) -> None:
    copy = vits.prepare_cpu(prepared, OLD)
    assert copy is not None
    user = OtherProcess(copy.directory)
    try:
        assert not inuse.remove_unheld(copy.directory)
        assert copy.front.is_file()
        user.go_on()
    finally:
        user.kill()
    assert inuse.remove_unheld(copy.directory)
    assert not copy.directory.exists()
    assert not list(prepared.directory.glob(".removing-*"))


def test_a_loaded_voice_holds_its_copies_until_it_is_closed(model: Path, prepared: vits.Prepared) -> None:
    voice = PiperVoice.load(VOICE, model, threads=2, prepared_dir=prepared.directory.parent)
    copy = prepared.directory / f"cpu-{cpu_fingerprint()}"
    try:
        assert voice.streaming
        assert not inuse.remove_unheld(copy) and not inuse.remove_unheld(prepared.directory)
    finally:
        voice.close()
    assert inuse.remove_unheld(copy)


def test_a_copy_that_does_not_load_is_left_to_the_process_using_it(model: Path, tmp_path: Path) -> None:
    directory = tmp_path / "joe"
    copy = vits.prepare_cpu(vits.prepare(model, directory))
    assert copy is not None
    user = OtherProcess(copy.directory)
    try:
        copy.vocoder.write_bytes(b"not an onnx model")  # damaged on disk, after the other loaded it
        voice = PiperVoice.load(VOICE, model, threads=1, prepared_dir=directory)
        try:
            assert not voice.streaming  # the whole graph, rather than pull the copy from under it
            assert sum(s.size for _, s, _ in voice.stream(["Hello."])) > 0
        finally:
            voice.close()
        assert copy.directory.is_dir()
        user.go_on()
    finally:
        user.kill()
    voice = PiperVoice.load(VOICE, model, threads=1, prepared_dir=directory)
    try:
        assert voice.streaming  # nobody holds it now: made again
    finally:
        voice.close()
