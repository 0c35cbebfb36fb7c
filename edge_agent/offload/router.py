"""`SynthRouter`: remote synthesis when the server is healthy, local synthesis otherwise.

The router splits the text once, with the local voice's splitter, and sends
the server those exact sentences: sentence `i` means the same words on both
sides. A remote sentence is yielded only when it is complete. When the server
fails (connection lost, ERROR, a deadline missed), the sentences not yet
yielded are synthesized locally, so every sentence is spoken exactly once:
none lost, none repeated. A partially received sentence is dropped and
spoken locally in full.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator

import numpy as np

from edge_agent.audio.resample import resample
from edge_agent.config import OffloadSettings, Settings, TtsSettings
from edge_agent.models.store import ModelStore
from edge_agent.offload.client import OffloadClient, Unavailable
from edge_agent.offload.codecs import opus_rate
from edge_agent.offload.messages import Codec
from edge_agent.offload.transport import OffloadError
from edge_agent.tts.local import LocalSynthesizer
from edge_agent.tts.voice import AudioChunk, Voice, synthesize_sentences

log = logging.getLogger(__name__)


class SynthRouter:
    """A `Synthesizer` that prefers the server (policy `auto`/`remote`) and falls back locally."""

    def __init__(self, local: LocalSynthesizer, settings: OffloadSettings,
                 client: OffloadClient | None = None) -> None:
        self.local = local
        self.settings = settings
        self.client = client
        self.tts: TtsSettings = local.settings

    @property
    def remote_enabled(self) -> bool:
        return self.client is not None and self.settings.policy != "local"

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
        """Yield remote sentences; returns the index of the first sentence not yielded."""
        client = self.client
        assert client is not None
        s = self.settings
        strict = s.policy == "remote"
        started = time.monotonic()
        if not client.breaker.allow():
            reason = client.breaker.last_failure or "server failing"
            return self._give_up(strict, 0, f"circuit open ({reason})")
        client.wait_ready(min(s.connect_timeout_s, s.first_audio_deadline_s))
        info = client.info
        remote_voice = self._remote_voice(voice)
        if info is not None and remote_voice not in info.voices:
            client.breaker.success()  # the server is fine; it just does not have this voice
            return self._give_up(strict, 0, f"server does not offer voice {remote_voice!r}")
        codec, rate = self._wire_format(info.codecs if info else frozenset({Codec.PCM16}), out_rate)
        try:
            remote = client.open_stream(sentences, remote_voice, codec, rate, s.first_audio_deadline_s)
        except Unavailable as exc:
            return self._give_up(strict, 0, str(exc))
        gap = np.zeros(round(self.tts.sentence_silence_s * out_rate), dtype=np.float32)
        index = 0
        heard_until = 0.0  # when the audio yielded so far will have finished playing
        try:
            while index < len(sentences):
                now = time.monotonic()
                if index == 0:
                    timeout = started + s.first_audio_deadline_s - now
                else:
                    timeout = max(s.sentence_timeout_s, heard_until - now)
                sentence = remote.next_sentence(max(timeout, 0.0))
                if sentence is None:
                    raise OffloadError(f"stream ended after {index} of {len(sentences)} sentences")
                audio = resample(sentence.samples, sentence.sample_rate, out_rate)
                audio = np.concatenate([audio, gap])
                if index == 0:
                    heard_until = time.monotonic()
                    log.debug("remote first audio after %.3f s", heard_until - started)
                heard_until = max(heard_until, time.monotonic()) + len(audio) / out_rate
                yield AudioChunk(audio, out_rate, sentence.index, last=True, engine="remote")
                index += 1
            remote.next_sentence(s.sentence_timeout_s)  # consume END
        except OffloadError as exc:
            remote.cancel()
            client.breaker.failure(str(exc))
            return self._give_up(strict, index, str(exc))
        finally:
            remote.cancel()  # no-op after END; stops the server if the listener stopped early
        client.breaker.success()
        return index

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
        if self.client is not None:
            self.client.close()


def make_synthesizer(settings: Settings, store: ModelStore) -> SynthRouter:
    """The synthesizer `settings` ask for; its client (if any) is already connecting. Close it when done.

    With no `offload.server`, or policy `local`, the router never leaves the device.
    """
    from edge_agent.offload.auth import load_psk
    from edge_agent.tts.registry import VoiceRegistry

    local = LocalSynthesizer(VoiceRegistry(store, settings.tts), settings.tts)
    offload = settings.offload
    client = None
    if offload.server and offload.policy != "local":
        client = OffloadClient(offload, load_psk(offload.psk_file))
        client.start()
    return SynthRouter(local, offload, client)
