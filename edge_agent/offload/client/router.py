"""`SynthRouter`: remote synthesis on a healthy server, local synthesis otherwise.

The router splits the text once, with the local voice's splitter, and sends
a server those exact sentences: sentence `i` means the same words on both
sides. A remote sentence is yielded only when it is complete. When a server
fails (connection lost, ERROR, a deadline missed), the sentences not yet
yielded go to the next server the pool offers (a refusal such as BUSY moves
them at once), and when none is left they are synthesized locally, so every
sentence is spoken exactly once: none lost, none repeated. A partially
received sentence is dropped and spoken again in full.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass

import numpy as np

from edge_agent.audio.frames import AudioChunk
from edge_agent.audio.resample import resample
from edge_agent.offload.client.connection import OffloadClient
from edge_agent.offload.client.errors import RemoteError, RemoteTimeout, Unavailable
from edge_agent.offload.client.servers import ServerPool
from edge_agent.offload.client.stream import RemoteSentence, RemoteStream
from edge_agent.offload.settings import OffloadSettings
from edge_agent.offload.wire.auth import load_psk
from edge_agent.offload.wire.codecs import opus_rate
from edge_agent.offload.wire.framing import ErrorCode
from edge_agent.offload.wire.messages import Codec
from edge_agent.offload.wire.transport import OffloadError
from edge_agent.tts.local import LocalSynthesizer
from edge_agent.tts.settings import TtsSettings
from edge_agent.tts.voice import Voice, VoiceOffer, synthesize_sentences

log = logging.getLogger(__name__)


MOVE_AT_ONCE = frozenset({ErrorCode.BUSY, ErrorCode.TOO_MANY_STREAMS, ErrorCode.SHUTTING_DOWN,
                          ErrorCode.UNKNOWN_VOICE})
"""Refusals of a healthy server: the stream goes to the next server at once, its breaker untouched."""


@dataclass
class _Progress:
    """How far one utterance has got, across the servers it moved through."""

    first_by: float
    """Monotonic time by which a server's first sentence must be complete."""
    index: int = 0
    """The next sentence to yield."""
    heard_until: float = 0.0
    """When the audio yielded so far will have finished playing."""


class SynthRouter:
    """A `Synthesizer` that prefers a server (policy `auto`/`remote`) and falls back locally."""

    def __init__(self, local: LocalSynthesizer, settings: OffloadSettings,
                 pool: ServerPool | None = None) -> None:
        self.local = local
        self.settings = settings
        self.pool = pool
        self.tts: TtsSettings = local.settings

    @property
    def remote_enabled(self) -> bool:
        return self.pool is not None and self.settings.policy != "local"

    def offers(self) -> list[VoiceOffer]:
        """The local voice; with remote synthesis on, also every voice a connected server offers and
        the configured `offload.voice` (unreachable while no connected server offers it)."""
        offers = self.local.offers()
        if self.pool is None or not self.remote_enabled:
            return offers
        served = self.pool.voices()
        if self.settings.voice:
            served.setdefault(self.settings.voice, False)
        return offers + [VoiceOffer(voice, "remote", ok) for voice, ok in served.items()]

    def unload_idle(self) -> list[str]:
        """Free local voices unused for `tts.idle_unload_s`."""
        return self.local.unload_idle()

    def sample_rate(self, voice: str | None = None) -> int:
        """Rate of every chunk `stream` yields for `voice` (the local voice's rate)."""
        return self._local_voice(voice).sample_rate

    def _local_voice(self, voice: str | None) -> Voice:
        wanted = voice or self.tts.voice
        if wanted not in self.local.voices.ids():
            wanted = self.tts.voice  # a server-only voice: speak locally with the default one
        return self.local.voices.get(wanted)

    def stream(self, text: str, voice: str | None = None) -> Iterator[AudioChunk]:
        """Chunks of `text`, each sentence exactly once, tagged with the engine that made it."""
        local = self._local_voice(voice)
        sentences = local.sentences(text)
        if not sentences:
            return
        start = 0
        if self.remote_enabled:
            start = yield from self._remote(sentences, voice, local.sample_rate)
        if start < len(sentences):
            yield from synthesize_sentences(local, sentences, self.tts.sentence_silence_s, start)

    def _remote_voice(self, voice: str | None) -> str:
        return voice or self.settings.voice or self.tts.voice

    def _remote(self, sentences: list[str], voice: str | None,
                out_rate: int) -> Generator[AudioChunk, None, int]:
        """Yield remote sentences, moving to the next server when one fails; returns the index of
        the first sentence not yielded (what the local voice must speak)."""
        pool = self.pool
        assert pool is not None
        s = self.settings
        pool.wait_ready(min(s.connect_timeout_s, s.first_audio_deadline_s))
        remote_voice = self._remote_voice(voice)
        progress = _Progress(first_by=time.monotonic() + s.first_audio_deadline_s)
        tried: list[OffloadClient] = []
        reason = ""
        while progress.index < len(sentences):
            client = pool.choose(remote_voice, tried)
            if client is None:
                reason = f"{reason}; {pool.why_none(remote_voice)}" if reason else pool.why_none(remote_voice)
                break
            tried.append(client)
            failure = yield from self._from_server(client, sentences, remote_voice, out_rate, progress)
            if not failure:
                return progress.index
            reason = failure
            if progress.index < len(sentences):
                log.info("offload: %s; sentence %d onwards goes to the next server", failure, progress.index)
        if progress.index >= len(sentences):
            return progress.index
        return self._give_up(s.policy == "remote", progress.index, reason)

    def _from_server(self, client: OffloadClient, sentences: list[str], voice: str, out_rate: int,
                     progress: _Progress) -> Generator[AudioChunk, None, str]:
        """Stream `sentences[progress.index:]` from one server, as many requests as its limits
        need, one after another; returns "" or why it stopped."""
        while progress.index < len(sentences):
            failure = yield from self._request(client, sentences, voice, out_rate, progress)
            if failure:
                return failure
        return ""

    def _request(self, client: OffloadClient, sentences: list[str], voice: str, out_rate: int,
                 progress: _Progress) -> Generator[AudioChunk, None, str]:
        """One request: the sentences from `progress.index` that fit the server's limits."""
        s = self.settings
        info = client.info
        codec, rate = self._wire_format(info.codecs if info else frozenset({Codec.PCM16}), out_rate)
        start = progress.index
        end = request_end(sentences, start, s.max_request_chars,
                          (info.max_frame if info else 65536) - _SYNTH_OVERHEAD - len(voice.encode()))
        try:
            remote = client.open_stream(sentences[start:end], voice, codec, rate, s.first_audio_deadline_s)
        except Unavailable as exc:
            return f"{client.uri}: {exc}"
        gap = np.zeros(round(self.tts.sentence_silence_s * out_rate), dtype=np.float32)
        first = True
        try:
            while progress.index < end:
                now = time.monotonic()
                if first:
                    sentence = remote.next_sentence(max(progress.first_by, progress.heard_until, now) - now)
                else:
                    timeout = max(s.sentence_timeout_s, progress.heard_until - now)
                    sentence = self._next_or_probe(client, remote, timeout, progress.heard_until)
                if sentence is None:
                    raise OffloadError(f"stream ended after {progress.index - start} of {end - start} "
                                       "sentences")
                audio = resample(sentence.samples, sentence.sample_rate, out_rate)
                audio = np.concatenate([audio, gap])
                now = time.monotonic()
                if first:
                    log.debug("remote first audio from %s after %.3f s", client.uri,
                              now - (progress.first_by - s.first_audio_deadline_s))
                progress.heard_until = max(progress.heard_until, now) + len(audio) / out_rate
                yield AudioChunk(audio, out_rate, start + sentence.index, last=True, engine="remote")
                progress.index += 1
                first = False
            remote.next_sentence(s.sentence_timeout_s)  # consume END
        except RemoteError as exc:
            remote.cancel()
            if not (first and exc.code in MOVE_AT_ONCE):
                client.breaker.failure(str(exc))
            return f"{client.uri}: {exc}"
        except OffloadError as exc:
            remote.cancel()
            client.breaker.failure(str(exc))
            # The next server gets a fresh first-audio budget, counted from now.
            progress.first_by = time.monotonic() + s.first_audio_deadline_s
            return f"{client.uri}: {exc}"
        finally:
            remote.cancel()  # no-op after END; stops the server if the listener stopped early
        client.breaker.success()
        return ""

    def _next_or_probe(self, client: OffloadClient, remote: RemoteStream, timeout: float,
                       heard_until: float) -> RemoteSentence | None:
        """The next sentence within `timeout`; but when the audio still queued for the listener is down
        to `offload.stall_probe_s` and the sentence is missing, the server is pinged. A link that went
        dead closes nothing, so only a missing PONG tells it apart from a slow server: the rest then
        moves on at once, while the listener still has audio, instead of after the timeout."""
        s = self.settings
        started = time.monotonic()
        probe_in = heard_until - s.stall_probe_s - started
        if s.stall_probe_s <= 0 or not 0 < probe_in < timeout:
            return remote.next_sentence(max(timeout, 0.0))
        try:
            return remote.next_sentence(probe_in)
        except RemoteTimeout:
            pass
        try:
            client.ping(min(s.ping_timeout_s, s.stall_probe_s / 2))
        except (OffloadError, TimeoutError, concurrent.futures.TimeoutError) as exc:
            raise RemoteTimeout(f"no PONG while a sentence was due ({exc}): the link looks dead") from None
        return remote.next_sentence(max(started + timeout - time.monotonic(), 0.0))

    def _give_up(self, strict: bool, index: int, reason: str) -> int:
        if strict:
            raise OffloadError(f"remote synthesis failed at sentence {index}: {reason}")
        if index:
            log.warning("offload failed after %d sentence(s) (%s); speaking the rest locally", index, reason)
        else:
            log.info("speaking locally: %s", reason)
        return index

    def _wire_format(self, agreed: frozenset[Codec], out_rate: int) -> tuple[Codec, int]:
        """Codec and the rate to ask for: Opus at the nearest Opus rate, PCM16 at our own rate."""
        choice = self.settings.codec
        if choice != "pcm16" and Codec.OPUS in agreed:
            return Codec.OPUS, opus_rate(out_rate)
        if choice == "opus":
            log.info("Opus not available on this connection; using PCM16")
        return Codec.PCM16, out_rate

    def close(self) -> None:
        """Close the server connection; the local synthesizer may be shared (`bench offload`), so its
        owner closes it."""
        if self.pool is not None:
            self.pool.close()


def make_synthesizer(offload: OffloadSettings, local: LocalSynthesizer) -> SynthRouter:
    """The synthesizer `offload` asks for, beside the `local` voice; its client (if any) is already
    connecting. Close it when done (the local voice is its owner's to close).

    With no `offload.server`/`offload.servers`, or policy `local`, the router never leaves the device.
    """
    pool = None
    if offload.offloads:
        pool = ServerPool(offload, load_psk(offload.psk_file))
        pool.start()
    return SynthRouter(local, offload, pool)


_SYNTH_OVERHEAD = 64
"""Bytes of a SYNTH payload besides its text and voice id (fixed fields, length prefixes), with room."""


def request_end(sentences: list[str], start: int, max_chars: int, max_bytes: int) -> int:
    """End of the run of sentences from `start` that one request may carry: at most `max_chars`
    characters and `max_bytes` of UTF-8 (newline-separated), and always at least one sentence."""
    chars = size = 0
    end = start
    while end < len(sentences):
        sentence = sentences[end]
        chars += len(sentence)
        size += len(sentence.encode()) + 1
        if end > start and (chars > max_chars or size > max_bytes):
            break
        end += 1
    return end
