"""One utterance from a server, read sentence by sentence from a synchronous thread.

The connection's event loop `deliver`s the stream's messages; the synthesizing
thread takes whole sentences with `next_sentence`. Each sentence is decoded by
a fresh `SentenceDecoder`, so no codec state outlives it.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.offload.client.errors import RemoteError, RemoteTimeout
from edge_agent.offload.wire.codecs import SentenceDecoder
from edge_agent.offload.wire.framing import ProtocolError
from edge_agent.offload.wire.messages import Audio, End, Error, Format, Message
from edge_agent.offload.wire.transport import OffloadError


@dataclass(frozen=True)
class RemoteSentence:
    index: int
    samples: Samples
    sample_rate: int


@dataclass
class _Assembly:
    decoder: SentenceDecoder
    pieces: list[Samples] = field(default_factory=list)


class RemoteStream:
    """One utterance from the server, read sentence by sentence from a synchronous thread.

    A sentence is handed out only once its last chunk has arrived: if the
    server dies mid-sentence, that sentence was never heard and the caller
    speaks it (and the rest) locally.
    """

    MAX_BUFFERED = 32 * 1024 * 1024
    """Encoded audio held for a reader that does not keep up; beyond it the stream fails."""

    def __init__(self, cancel: Callable[[int], None], sentences: int) -> None:
        self._cancel = cancel
        """Asks the server to stop a stream id (the owning client's `cancel`)."""
        self.sentences = sentences
        self.stream = 0
        self._events: queue.Queue[Message | OffloadError] = queue.Queue()
        self._buffered = 0
        self._overflowed = False
        self._format: Format | None = None
        self._current: _Assembly | None = None
        self._next = 0
        self.ended = False
        self.end: End | None = None

    def deliver(self, event: Message | OffloadError) -> None:
        """Called on the event-loop thread; bounded by `MAX_BUFFERED` bytes of audio."""
        if self._overflowed:
            return
        if isinstance(event, Audio):
            self._buffered += len(event.data)
            if self._buffered > self.MAX_BUFFERED:
                self._overflowed = True
                self._cancel(self.stream)
                event = OffloadError(f"more than {self.MAX_BUFFERED} bytes of audio waiting; "
                                     "the reader is not keeping up")
        self._events.put(event)

    def next_sentence(self, timeout: float) -> RemoteSentence | None:
        """The next complete sentence, None after END; `OffloadError` on error or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if self.ended:
                return None
            remaining = deadline - time.monotonic()
            try:
                event = self._events.get(timeout=max(remaining, 0.0))
            except queue.Empty:
                raise RemoteTimeout(f"sentence {self._next} not complete within {timeout:.2f} s") from None
            if isinstance(event, OffloadError):
                self.ended = True
                raise event
            if isinstance(event, Audio):
                self._buffered -= len(event.data)
            sentence = self._take(event)
            if sentence is not None:
                return sentence

    def _take(self, message: Message) -> RemoteSentence | None:
        if isinstance(message, Error):
            self.ended = True
            raise RemoteError(message.code, message.name, message.message)
        if isinstance(message, End):
            self.ended = True
            self.end = message
            if self._next < self.sentences and not message.cancelled:
                raise OffloadError(f"server ended the stream after {self._next} of "
                                   f"{self.sentences} sentences")
            return None
        if isinstance(message, Format):
            if self._format is not None:
                raise self._violation("second FORMAT on one stream")
            self._format = message
            return None
        if not isinstance(message, Audio):
            raise self._violation(f"unexpected {type(message).__name__}")
        fmt = self._format
        if fmt is None:
            raise self._violation("AUDIO before FORMAT")
        if message.sentence != self._next:
            raise self._violation(f"audio for sentence {message.sentence}, expected {self._next}")
        try:
            if self._current is None:
                self._current = _Assembly(SentenceDecoder(fmt.codec, fmt.sample_rate, fmt.frame_samples,
                                                          fmt.pre_skip))
            self._current.pieces.append(self._current.decoder.decode(message.samples, message.data))
        except ProtocolError as exc:
            raise self._violation(str(exc)) from None
        if not message.last:
            return None
        pieces = self._current.pieces
        self._current = None
        index = self._next
        self._next += 1
        audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
        return RemoteSentence(index, audio, fmt.sample_rate)

    def _violation(self, what: str) -> OffloadError:
        self.ended = True
        return OffloadError(f"server sent bad audio: {what}")

    def cancel(self) -> None:
        """Tell the server to stop (no-op once the stream has ended)."""
        if not self.ended:
            self.ended = True
            self._cancel(self.stream)
