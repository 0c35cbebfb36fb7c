"""`bench turn --answer`: end of speech -> the first audio of a local answer, through the daemon.

The processes `bench turn` feeds are then two daemons (`edge-agent run`, `listen.end_of_turn: vad`
and `model`) on a private mosquitto, instead of `listen`: each reads its FIFO as `listen` does and
plays through `audio.output_command` (`dd`) into a FIFO of the bench's (`Player`), which a thread
reads and times. A client (`Answerer`) subscribed to both devices' transcripts answers each one at
once, as a home automation would: an announcement on `edge/<device>/announce` carrying the turn's
`conversation_id` ("Okay."), which the daemon speaks next, over the turn's hold. The answer of a
clip is the first audio read after its speech ended, timed where its first sample above -40 dBFS
plays (the read's arrival plus the samples before it at `audio.output_rate`: a player starts on
the first byte); an answer already playing when the speech ended (to a first sentence the end of
turn took for the whole command) is counted apart, `answered_early`, and not timed. The wake
chime is off, so what the player gets is answers only.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edge_agent.config import parse_uri

OUTPUT_RATE = 22050
"""`audio.output_rate` the daemons play at."""
AUDIBLE = round(0.01 * 32767)
"""-40 dBFS in 16-bit samples: the first sample above it is the answer's first audio."""
ANSWER = "Okay."
CONNECT_TIMEOUT_S = 20.0


@dataclass
class Player:
    """The FIFO a daemon's `audio.output_command` writes into, read by a thread of its own: the
    arrival time of every audible stretch (the first audible sample of each read, as played)."""

    path: Path
    audible: list[float] = field(default_factory=list)
    """When each read's first sample above `AUDIBLE` plays: its arrival plus the samples before it
    since the stream started (a read right after another continues its stream)."""
    _fd: int = -1
    _thread: threading.Thread | None = None
    _stop: tuple[int, int] = (-1, -1)

    def start(self) -> Player:
        os.mkfifo(self.path)
        # Read and write: the FIFO never reaches end of file when one run of the command exits.
        self._fd = os.open(self.path, os.O_RDWR)
        self._stop = os.pipe()
        self._thread = threading.Thread(target=self._read, name=f"player-{self.path.stem}", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        stream_start, stream_bytes, last = 0.0, 0, -1.0
        while True:
            ready = select.select([self._fd, self._stop[0]], [], [])[0]
            if self._stop[0] in ready:
                return
            data = os.read(self._fd, 1 << 16)
            arrived = time.monotonic()
            if arrived - last > 0.25:  # a new answer (one run of the command): its own stream
                stream_start, stream_bytes = arrived, 0
            last = arrived
            samples = np.frombuffer(data[:len(data) - len(data) % 2], dtype="<i2")
            loud = np.nonzero(np.abs(samples.astype(np.int32)) > AUDIBLE)[0]
            if loud.size:
                # Played from the stream's first byte at the output rate, or on arrival if the reads
                # fell behind it.
                at = max(arrived, stream_start + (stream_bytes // 2 + int(loud[0])) / OUTPUT_RATE)
                self.audible.append(at)
            stream_bytes += len(data)

    def close(self) -> None:
        if self._thread is not None:
            os.write(self._stop[1], b"x")
            self._thread.join(timeout=10)
        for fd in (self._fd, *self._stop):
            if fd >= 0:
                os.close(fd)


class Answerer:
    """Answers each transcript of the devices at once with an announcement carrying its
    `conversation_id`, and hands the transcript to `on_transcript(device, arrived, doc)`."""

    def __init__(self, url: str, on_transcript: Any) -> None:
        ep = parse_uri(url, ("mqtt",))
        self.on_transcript = on_transcript
        self.answered = 0
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, *_: c.subscribe("edge/+/transcript", qos=1)
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.connect(ep.host, ep.port, keepalive=30)
        self.client.loop_start()
        if not self._subscribed.wait(CONNECT_TIMEOUT_S):
            raise RuntimeError(f"could not subscribe to the transcripts on {url}")

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        arrived = time.monotonic()
        doc = json.loads(msg.payload)
        device = msg.topic.split("/")[1]
        if doc.get("conversation_id"):
            answer = {"id": f"answer-{uuid.uuid4().hex[:12]}", "text": ANSWER,
                      "conversation_id": doc["conversation_id"]}
            client.publish(f"edge/{device}/announce", json.dumps(answer), qos=1)
            self.answered += 1
        self.on_transcript(device, arrived, {"event": "transcript", **doc})

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def device(end: str) -> str:
    return f"bench-turn-{end}"


def start_daemon(end: str, fifo: Path, player: Path, *, url: str, tmp: Path, passed: list[str],
                 log: Path) -> subprocess.Popen[bytes]:
    """`edge-agent run` for one end of turn, reading 16 kHz mono PCM from `fifo` and playing into
    `player`, its journal and state in a fresh folder of `tmp`."""
    state = tmp / f"state-{end}"
    cmd = [sys.executable, "-m", "edge_agent", "run", *passed, "--broker", url, "--device-id", device(end),
           "--set", f'audio.input_pipe="{fifo}"', "--set", "audio.input_rate=16000",
           "--set", "audio.input_channels=1", "--set", f"listen.end_of_turn={end}",
           "--set", "wake.chime=false", "--set", f"audio.output_rate={OUTPUT_RATE}",
           "--set", f'audio.output_command="dd of={player} bs=4096 status=none"',
           "--set", f'daemon.state_dir="{state}"', "--set", "daemon.metrics_s=0"]
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
                            env=env)


def first_answer(audible: list[float], started: float, speech_written: float,
                 until: float) -> tuple[float | None, bool]:
    """A slot's answer: when its first audio played after the speech ended (None: none before `until`,
    the next slot's start), and whether an answer began while the clip's speech still went on."""
    early = any(started < t <= speech_written for t in audible)
    after = [t for t in audible if speech_written < t <= until]
    return (after[0] if after else None), early
