"""`edge-agent doctor` checks the offload server with a real handshake and ping."""

from __future__ import annotations

from tests.conftest import run_cli
from tests.integration.offload.offload_helpers import PIPER, PSK


def server_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if " server " in line)


def doctor(uri: str, key: str, voice: str = PIPER) -> str:
    result = run_cli("doctor", "--timeout", "3", "--set", f"offload.server={uri}", "--set",
                     f"offload.voice={voice}", "--set", 'mqtt.broker=""', "--set", "audio.output=wav",
                     env={"EDGE_OFFLOAD_PSK": key})
    return server_line(result.stdout)


def test_doctor_authenticates_and_pings_the_server(serve):
    server = serve()
    line = doctor(server.uri, PSK.decode())
    assert line.startswith("ok")
    assert "authenticated" in line and "ping" in line and f"{PIPER} (22050 Hz)" in line


def test_doctor_reports_a_wrong_key(serve):
    server = serve()
    line = doctor(server.uri, "a-key-the-server-does-not-know")
    assert line.startswith("warn") and "AUTH_FAILED" in line


def test_doctor_reports_a_voice_the_server_does_not_offer(serve):
    server = serve()
    line = doctor(server.uri, PSK.decode(), voice="kokoro-82m")
    assert line.startswith("warn") and "'kokoro-82m' is not offered" in line


def test_doctor_reports_an_absent_server():
    line = doctor("tcp://127.0.0.1:9", PSK.decode())
    assert line.startswith("warn") and "127.0.0.1:9" in line


def test_doctor_checks_every_configured_server(serve):
    from tests.integration.offload.offload_helpers import free_port

    server, absent = serve(), f"tcp://127.0.0.1:{free_port()}"
    result = run_cli("doctor", "--timeout", "3", "--set", f"offload.servers=[{server.uri}, {absent}]",
                     "--set", f"offload.voice={PIPER}", "--set", 'mqtt.broker=""',
                     "--set", "audio.output=wav", env={"EDGE_OFFLOAD_PSK": PSK.decode()})
    lines = [line for line in result.stdout.splitlines() if " server " in line]
    assert len(lines) == 2
    assert lines[0].startswith("ok") and server.uri in lines[0] and "authenticated" in lines[0]
    assert lines[1].startswith("warn") and absent in lines[1]
