"""The hearing loop on real models: microWakeWord, webrtcvad and the exported Whisper."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.clips import load_16k, piper_clip
from edge_agent.asr.transcriber import Transcriber
from edge_agent.asr.whisper import Padding
from edge_agent.config import AsrSettings, ListenSettings, VadSettings, WakeSettings
from edge_agent.listen import Heard, Hearing, Reopened, Streamed, TurnEnded, Woke
from edge_agent.listen.endofturn import EndOfTurn, SmartTurn
from edge_agent.listen.transcribing import Transcribing
from edge_agent.text.wer import wer
from edge_agent.vad import Segmenter, WebRtcClassifier
from edge_agent.wake import WakeEngine
from tests.speech_fixtures import TWO_SENTENCES, piper_speed_clip, run_cli, silence, write_wav

WAKE_COMMAND = "Okay Nabu, turn on the kitchen lights."
COMMAND = "Set a timer for ten minutes."
OTHER = "What is the weather like tomorrow?"


@pytest.fixture(scope="module")
def speech(clip_cache: Path, piper_voice) -> dict[str, np.ndarray]:
    texts = (WAKE_COMMAND, COMMAND, OTHER)
    return {text: load_16k(piper_clip(text, clip_cache, piper_voice)) for text in texts}


@pytest.fixture(scope="module")
def wake_engine() -> WakeEngine:
    return WakeEngine.load(WakeSettings())


def hearing(whisper, wake_engine, mode="wake", end_of_turn: EndOfTurn | None = None, **listen) -> Hearing:
    wake_engine.reset()
    segmenter = Segmenter(WebRtcClassifier(2), VadSettings())
    transcribing = Transcribing(segmenter, Transcriber(whisper, AsrSettings()))
    return Hearing(mode, transcribing, wake_engine if mode == "wake" else None, ListenSettings(**listen),
                   end_of_turn=end_of_turn)


def run(h: Hearing, audio: np.ndarray, block: int = 480) -> list:
    events = []
    for start in range(0, len(audio), block):
        events += h.push(audio[start:start + block])
    return events + h.flush()


def test_a_wake_word_opens_one_turn_whose_transcript_is_the_command(whisper, wake_engine, speech):
    audio = np.concatenate([silence(0.5), speech[WAKE_COMMAND], silence(1.5), speech[OTHER], silence(1.5)])
    events = run(hearing(whisper, wake_engine), audio)
    assert [type(e) for e in events] == [Woke, Heard, TurnEnded]
    woke, heard, ended = events
    assert woke.detection.model == "okay_nabu" and heard.wake_word == "Okay Nabu"
    assert heard.conversation_id == woke.conversation_id == ended.conversation_id
    assert wer(["turn on the kitchen lights"], [heard.transcript.text]) == 0
    lookback = ListenSettings().lookback_ms / 1000  # the turn starts that long before the detection
    turn_start = round(woke.detection.time - lookback, 3)
    assert turn_start <= heard.transcript.start < heard.transcript.end < ended.time
    # The second sentence came after the turn without a wake word: never transcribed.


def test_without_a_wake_word_nothing_is_transcribed_in_wake_mode_and_everything_in_always(
        whisper, wake_engine, speech):
    audio = np.concatenate([silence(0.5), speech[COMMAND], silence(1.0), speech[OTHER], silence(1.0)])
    h = hearing(whisper, wake_engine)
    assert run(h, audio) == []
    assert h.transcribing.stats.utterances == 0  # Whisper never ran
    heard = run(hearing(whisper, wake_engine, mode="always"), audio)
    assert [type(e) for e in heard] == [Heard, Heard]
    assert wer([COMMAND, OTHER], [e.transcript.text for e in heard]) <= 0.2
    assert all(e.conversation_id is None for e in heard)


def test_open_turn_listens_for_exactly_one_command_without_a_wake_word(whisper, wake_engine, speech):
    h = hearing(whisper, wake_engine)
    h.open_turn("conv-7")
    audio = np.concatenate([silence(0.3), speech[COMMAND], silence(1.0), speech[OTHER], silence(1.0)])
    events = run(h, audio)
    assert [type(e) for e in events] == [Heard, TurnEnded]
    assert events[0].conversation_id == "conv-7" and events[0].wake_word is None
    assert wer([COMMAND], [events[0].transcript.text]) <= 0.2


def test_a_turn_with_no_command_ends_at_the_timeout(whisper, wake_engine, speech):
    h = hearing(whisper, wake_engine, command_timeout_s=1.5)
    wake_only = speech[WAKE_COMMAND][: round(1.0 * 16000)]  # "Okay Nabu" and no command
    events = run(h, np.concatenate([silence(0.5), wake_only, silence(4.0)]))
    assert isinstance(events[0], Woke) and isinstance(events[-1], TurnEnded), events
    assert events[-1].reason == "timeout"
    assert events[-1].time == pytest.approx(events[0].detection.time + 1.5, abs=0.05)


def test_a_rejected_wake_word_opens_no_turn(whisper, wake_engine, speech):
    h = hearing(whisper, wake_engine)
    h.accept_wake = lambda detection: False
    assert run(h, np.concatenate([silence(0.5), speech[WAKE_COMMAND], silence(1.5)])) == []


def test_ending_at_a_confident_pause_is_sooner_with_the_same_words(whisper, wake_engine, speech):
    audio = np.concatenate([silence(0.5), speech[WAKE_COMMAND], silence(1.5)])
    early = run(hearing(whisper, wake_engine, early_end_ms=150), audio)
    late = run(hearing(whisper, wake_engine), audio)
    (early_heard, early_end), (late_heard, late_end) = early[1:], late[1:]
    assert early_heard.early and not late_heard.early
    assert early_heard.transcript.text == late_heard.transcript.text
    # Where each turn ended is a position in the stream, decided by the audio alone (never by
    # how long Whisper took): the same speech, ended 150 ms after it against the VAD's 500 ms
    # hangover, each to the frame (30 ms) that completes the pause.
    assert early_heard.transcript.end == late_heard.transcript.end
    frame_s = VadSettings().frame_ms / 1000
    assert 0.15 <= round(early_end.time - early_heard.transcript.end, 3) < 0.15 + frame_s
    hangover_s = VadSettings().hangover_ms / 1000
    assert hangover_s <= round(late_end.time - late_heard.transcript.end, 3) < hangover_s + frame_s


def test_the_decode_during_the_pause_is_the_command_and_whisper_runs_once(whisper, wake_engine, speech):
    h = hearing(whisper, wake_engine)
    events = run(h, np.concatenate([silence(0.5), speech[WAKE_COMMAND], silence(1.5)]))
    heard = events[1].transcript
    assert h.transcribing.stats.utterances == 1  # decoded in the pause, reused when the VAD ended it
    assert wer(["turn on the kitchen lights"], [heard.text]) == 0
    # Ready once the hangover is over (Whisper ran during it) or when Whisper finished, if later.
    assert heard.latency_s == pytest.approx(max(0.5, 0.2 + heard.asr_s), abs=0.035)


@pytest.fixture(scope="module")
def two_sentences(clip_cache: Path, shared_cache: Path) -> np.ndarray:
    """The truncation clip: a slow noiseless joe saying two sentences with a 150-240 ms pause."""
    return load_16k(piper_speed_clip(TWO_SENTENCES, clip_cache, shared_cache, 1.25))


def test_a_second_sentence_after_a_pause_is_part_of_the_command(whisper, wake_engine, two_sentences):
    audio = np.concatenate([silence(0.3), two_sentences, silence(1.5)])
    h = hearing(whisper, wake_engine)
    h.open_turn("dinner")
    heard = [e for e in run(h, audio) if isinstance(e, Heard)]
    assert len(heard) == 1 and "table" in heard[0].transcript.text.lower(), heard
    # The old default (ending at the first 150 ms pause after a complete sentence) lost it.
    h = hearing(whisper, wake_engine, early_end_ms=150)
    h.open_turn("dinner")
    cut = [e for e in run(h, audio) if isinstance(e, Heard)]
    assert "table" not in cut[0].transcript.text.lower()


def test_listen_cli_prints_one_wake_and_one_transcript_as_json(tmp_path, whisper_dir, speech):
    wav = write_wav(tmp_path / "turn.wav", np.concatenate([silence(0.5), speech[WAKE_COMMAND], silence(2.0)]))
    result = run_cli("listen", "--input", str(wav), "--json", "--set", f"asr.model={whisper_dir}")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert [e["event"] for e in events] == ["wake", "transcript", "turn_end"]
    assert events[0]["wake_word"] == "Okay Nabu"
    assert "kitchen lights" in events[1]["text"].lower()
    assert events[1]["conversation_id"] == events[0]["conversation_id"]
    # Where the transcript was decided, in stream time (its speech's end and the pause after it).
    assert events[1]["end"] < events[1]["time"] <= events[2]["time"] and "continued" not in events[1]


def test_listen_cli_hears_raw_pcm_from_a_configured_input_pipe_on_stdin(tmp_path, whisper_dir, speech):
    import subprocess
    import sys

    from edge_agent.audio.resample import resample
    from edge_agent.audio.wav import encode_pcm

    room = np.concatenate([silence(0.5), speech[WAKE_COMMAND], silence(2.0)])
    pcm = encode_pcm(resample(room, 16000, 48000), 2, 2)  # `arecord -r 48000 -c 2 -f S16_LE -t raw | ...`
    result = subprocess.run(
        [sys.executable, "-m", "edge_agent", "listen", "--json", "--set", f"asr.model={whisper_dir}",
         "--set", 'audio.input_pipe="-"', "--set", "audio.input_rate=48000",
         "--set", "audio.input_channels=2"],
        input=pcm, capture_output=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr.decode()
    events = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert [e["event"] for e in events][:2] == ["wake", "transcript"]
    assert "kitchen lights" in events[1]["text"].lower()


def test_listen_cli_with_a_corrupt_custom_model_is_one_line_and_exit_2(tmp_path, whisper_dir, speech):
    (tmp_path / "mine.tflite").write_bytes(b"\x00" * 4096)
    (tmp_path / "mine.json").write_text(json.dumps({
        "wake_word": "Mine", "model": "mine.tflite",
        "micro": {"probability_cutoff": 0.9, "sliding_window_size": 5}}))
    wav = write_wav(tmp_path / "turn.wav", np.concatenate([silence(0.5), speech[WAKE_COMMAND]]))
    result = run_cli("listen", "--input", str(wav), "--set", f"asr.model={whisper_dir}",
                     "--set", f"wake.models=[{tmp_path / 'mine.json'}]")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"edge-agent: error: wake model {tmp_path / 'mine.tflite'}: not a TensorFlow Lite model "
        "(the flatbuffer does not verify)"]


def test_a_streamed_turn_hands_on_the_audio_after_the_wake_word_until_it_is_ended(
        whisper, wake_engine, speech):
    h = hearing(whisper, wake_engine)
    h.stream_turns = lambda: True
    audio = np.concatenate([silence(0.5), speech[WAKE_COMMAND], silence(1.0)])
    events = []
    for start in range(0, len(audio), 480):
        events += h.push(audio[start:start + 480])
        if any(isinstance(e, Streamed) for e in events) and sum(
                e.samples.size for e in events if isinstance(e, Streamed)) >= 16000 * 2:
            h.end_turn("not-this-one")  # another turn's end changes nothing
    woke = events[0]
    assert isinstance(woke, Woke) and woke.streamed
    streamed = [e for e in events if isinstance(e, Streamed)]
    assert all(e.conversation_id == woke.conversation_id for e in streamed)
    h.end_turn(woke.conversation_id)
    ended = h.push(silence(0.03))
    assert [type(e) for e in ended] == [TurnEnded] and ended[0].reason == "ended"
    assert h.transcribing.stats.utterances == 0  # Whisper never ran: the remote side transcribes
    # What went out is the command from the lookback before the wake word on, in order and whole.
    sent = np.concatenate([e.samples for e in streamed])
    after_wake = audio[round(woke.detection.time * 16000) - round(ListenSettings().lookback_ms * 16):]
    assert np.array_equal(sent, after_wake[:sent.size])
    assert "kitchen lights" in whisper.recognize(sent, Padding.from_settings(AsrSettings())).text.lower()


def test_a_conversation_continued_without_a_wake_word_streams_its_turn_from_the_next_block(
        whisper, wake_engine, speech):
    h = hearing(whisper, wake_engine)
    h.stream_turns = lambda: True
    run(h, silence(0.3))
    h.open_turn("c2", stream=True)
    command = speech[COMMAND]
    events = run(h, np.concatenate([command, silence(0.5)]))
    assert isinstance(events[0], Reopened) and events[0].conversation_id == "c2"
    assert not any(isinstance(e, Woke) for e in events)
    sent = np.concatenate([e.samples for e in events if isinstance(e, Streamed)])
    assert np.array_equal(sent[:command.size], command)  # from the first sample on, nothing lost
    assert h.transcribing.stats.utterances == 0  # the remote side transcribes


def test_a_streamed_reopening_nobody_takes_any_more_is_heard_here(whisper, wake_engine, speech):
    h = hearing(whisper, wake_engine)
    h.stream_turns = lambda: False  # the controller left before the turn opened
    h.open_turn("c3", stream=True)
    events = run(h, np.concatenate([speech[COMMAND], silence(1.0)]))
    assert not any(isinstance(e, (Reopened, Streamed)) for e in events)
    heard = [e for e in events if isinstance(e, Heard)]
    assert heard and heard[0].conversation_id == "c3"


def test_a_streamed_turn_nobody_ends_stops_at_the_command_timeout(whisper, wake_engine, speech):
    h = hearing(whisper, wake_engine, command_timeout_s=2.0)
    h.stream_turns = lambda: True
    events = run(h, np.concatenate([silence(0.5), speech[WAKE_COMMAND], silence(4.0)]))
    woke, ended = events[0], events[-1]
    assert isinstance(ended, TurnEnded) and ended.reason == "timeout"
    sent = sum(e.samples.size for e in events if isinstance(e, Streamed))
    # The lookback, then exactly the turn's length after the wake word, nothing after its deadline.
    assert sent == round(ListenSettings().lookback_ms * 16) + round(2.0 * 16000)
    assert ended.time == pytest.approx(woke.detection.time + 2.0, abs=0.01)


@pytest.fixture(scope="module")
def wake_then_command(piper_voice, clip_cache: Path) -> np.ndarray:
    """"Okay Nabu, turn on the lights" with no pause: the phrase's end runs into the command's start."""
    phrase, command = (load_16k(piper_clip(t, clip_cache, piper_voice))
                       for t in ("Okay Nabu.", "Turn on the lights."))
    voiced = np.flatnonzero(np.abs(phrase) > 0.01)
    spoken = np.flatnonzero(np.abs(command) > 0.01)
    return np.concatenate([silence(0.5), phrase[:voiced[-1] + 1], command[spoken[0]:], silence(1.5)])


@pytest.fixture(scope="module")
def wake_chime_command(piper_voice, clip_cache: Path) -> np.ndarray:
    """"Okay Nabu." then the wait for the chime (0.9 s, longer than the VAD's hangover), then the command."""
    phrase, command = (load_16k(piper_clip(t, clip_cache, piper_voice)) for t in ("Okay Nabu.", COMMAND))
    return np.concatenate([silence(0.5), phrase, silence(0.9), command, silence(1.5)])


@pytest.mark.parametrize("end", ["vad", "model"])
def test_the_wake_phrase_in_the_turn_is_not_taken_for_the_command(whisper, wake_engine, wake_chime_command,
                                                                   ender, end):
    """A lookback long enough to take in the whole wake phrase, as a detection mid-phrase or a long
    `lookback_ms` does: the phrase ends by itself before the person speaks again, and the turn's
    transcript is still the command."""
    h = hearing(whisper, wake_engine, end_of_turn=ender if end == "model" else None, lookback_ms=1000)
    events = run(h, wake_chime_command)
    heard = [e for e in events if isinstance(e, Heard)]
    assert isinstance(events[0], Woke) and heard, events
    assert wer([COMMAND], [heard[-1].transcript.text]) <= 0.2, heard
    assert "nabu" not in heard[-1].transcript.text.lower().replace(" ", "")


def test_a_command_said_without_a_pause_keeps_its_first_word(whisper, wake_engine, wake_then_command):
    heard = [e for e in run(hearing(whisper, wake_engine), wake_then_command) if isinstance(e, Heard)]
    assert heard and "turn" in heard[0].transcript.text.lower(), heard
    # Starting at the detection, as before the lookback, the first word was clipped.
    clipped = [e for e in run(hearing(whisper, wake_engine, lookback_ms=0), wake_then_command)
               if isinstance(e, Heard)]
    assert not clipped or "turn" not in clipped[0].transcript.text.lower()


def test_a_streamed_turn_starts_with_the_first_word_of_a_command_said_without_a_pause(
        whisper, wake_engine, wake_then_command):
    h = hearing(whisper, wake_engine, command_timeout_s=2.0)
    h.stream_turns = lambda: True
    events = run(h, wake_then_command)
    sent = np.concatenate([e.samples for e in events if isinstance(e, Streamed)])
    text = whisper.recognize(sent, Padding.from_settings(AsrSettings())).text.lower()
    assert "turn on the lights" in text, text


def test_a_lookback_never_reaches_into_the_previous_turn(whisper, wake_engine, speech):
    h = hearing(whisper, wake_engine, lookback_ms=1000, command_timeout_s=3.0)
    h.stream_turns = lambda: True
    wake = speech[WAKE_COMMAND]
    audio = np.concatenate([silence(0.5), wake, silence(0.8), wake, silence(1.0)])
    events = run(h, audio)
    woken = [i for i, e in enumerate(events) if isinstance(e, Woke)]
    assert len(woken) == 2, events
    first_end = next(e for e in events if isinstance(e, TurnEnded))
    assert events[woken[1]].detection.time - 1.0 < first_end.time  # a full lookback would overlap
    sent = np.concatenate([e.samples for e in events[woken[1]:] if isinstance(e, Streamed)])
    begin = round(first_end.time * 16000)
    assert np.array_equal(sent, audio[begin:begin + sent.size])  # it starts where the first turn ended


@pytest.fixture(scope="module")
def ender(turn_model: Path):
    model = EndOfTurn(SmartTurn.load(turn_model), ListenSettings().turn_probability)
    yield model
    model.close()


def test_the_end_of_turn_model_ends_a_complete_command_at_the_pause_with_the_same_words(
        whisper, wake_engine, speech, ender):
    audio = np.concatenate([silence(0.5), speech[WAKE_COMMAND], silence(1.5)])
    h = hearing(whisper, wake_engine, end_of_turn=ender)
    judged = run(h, audio)
    vad = run(hearing(whisper, wake_engine), audio)
    assert [type(e) for e in judged] == [Woke, Heard, TurnEnded]
    # Whisper ran once, at the pause: the VAD's end of the same utterance later decoded nothing again.
    assert h.transcribing.stats.utterances == 1
    (heard, ended), (vad_heard, vad_ended) = judged[1:], vad[1:]
    assert heard.early and not heard.continued and heard.transcript.text == vad_heard.transcript.text
    assert ended.reason == "heard"
    # Heard at the pause the model was asked at (150 ms, to the 30 ms frame), not after the hangover;
    # the turn itself stays open for a continuation until the VAD ends the utterance, as without it.
    frame_s = VadSettings().frame_ms / 1000
    pause_s = ListenSettings().turn_pause_ms / 1000
    assert heard.time is not None
    assert pause_s <= round(heard.time - heard.transcript.end, 3) < pause_s + frame_s
    assert round(ended.time - heard.transcript.end, 3) == round(vad_ended.time - vad_heard.transcript.end, 3)
    assert round(vad_ended.time - vad_heard.transcript.end, 3) >= VadSettings().hangover_ms / 1000
    assert ender.stats.complete >= 1


def test_a_second_sentence_after_a_pause_judged_complete_is_the_turns_continuation(
        whisper, wake_engine, dinner, ender):
    first, second = dinner
    audio = np.concatenate([silence(0.5), first, silence(0.3), second, silence(2.0)])
    events = run(hearing(whisper, wake_engine, end_of_turn=ender), audio)
    heard = [e for e in events if isinstance(e, Heard)]
    assert [type(e) for e in events if not isinstance(e, Heard)] == [Woke, TurnEnded], events
    # The model judged the first sentence complete (its transcript went out at that pause), and the
    # second one, said before the VAD's hangover, made the whole command go out again.
    assert len(heard) == 2 and heard[0].early and not heard[0].continued, heard
    assert "ready" in heard[0].transcript.text.lower() and "table" not in heard[0].transcript.text.lower()
    assert heard[1].continued
    assert wer(["dinner is ready please come to the table"], [heard[1].transcript.text]) < 0.3
    ids = {e.conversation_id for e in events if isinstance(e, Heard | TurnEnded)}
    assert ids == {events[0].conversation_id}


def test_a_click_after_a_pause_judged_complete_sends_no_second_transcript(
        whisper, wake_engine, speech, ender):
    voiced = np.nonzero(np.abs(speech[OTHER]) > 0.01)[0]
    click = speech[OTHER][voiced[0] + 8000:voiced[0] + 8000 + 1600]  # 100 ms: under min_utterance_ms
    command = speech[WAKE_COMMAND][:np.nonzero(np.abs(speech[WAKE_COMMAND]) > 0.01)[0][-1] + 1]
    audio = np.concatenate([silence(0.5), command, silence(0.3), click, silence(3.0)])
    events = run(hearing(whisper, wake_engine, end_of_turn=ender), audio)
    heard = [e for e in events if isinstance(e, Heard)]
    ended = [e for e in events if isinstance(e, TurnEnded)]
    assert len(heard) == 1 and "kitchen" in heard[0].transcript.text.lower(), events
    assert len(ended) == 1 and ended[0].reason == "heard"
    # Over after the click and at most the wait of a pause judged incomplete, long before the deadline.
    wait_s = max(VadSettings().hangover_ms, ListenSettings().turn_incomplete_wait_ms) / 1000
    assert ended[0].time < heard[0].transcript.end + 0.3 + 0.1 + wait_s + 0.1
    assert wait_s + 0.5 < ListenSettings().command_timeout_s


@pytest.fixture(scope="module")
def mid_command(clip_cache: Path, piper_voice) -> tuple[np.ndarray, np.ndarray]:
    """A command with a pause in the middle: "Turn off the oven, and ... start the dishwasher."."""
    first, second = (load_16k(piper_clip(text, clip_cache, piper_voice))
                     for text in ("Okay Nabu. Turn off the oven, and", "start the dishwasher."))
    return first[:np.nonzero(np.abs(first) > 0.01)[0][-1] + 1], second


@pytest.mark.parametrize("pause_s", [0.6, 0.9])
def test_a_pause_judged_incomplete_waits_for_the_rest_of_the_command(
        whisper, wake_engine, mid_command, ender, pause_s):
    first, second = mid_command
    audio = np.concatenate([silence(0.5), first, silence(pause_s), second, silence(2.5)])
    h = hearing(whisper, wake_engine, end_of_turn=ender)
    judged = [e for e in run(h, audio) if isinstance(e, Heard)]
    assert len(judged) == 1, judged
    assert "oven" in judged[0].transcript.text.lower() and "dishwasher" in judged[0].transcript.text.lower()
    # Whisper ran once per part: at each pause; the VAD's end of the first part reused its decode.
    assert h.transcribing.stats.utterances == 2
    if pause_s > 0.6:
        # Past the VAD's hangover (500 ms, and the VAD's own lag): the VAD alone loses the rest.
        vad = [e for e in run(hearing(whisper, wake_engine), audio) if isinstance(e, Heard)]
        assert "dishwasher" not in vad[0].transcript.text.lower(), vad


def test_a_turn_that_never_stops_still_ends_at_the_command_timeout(whisper, wake_engine, speech, ender):
    """Speech that goes on (a TV) past `listen.command_timeout_s`: the model never gets its pause."""
    voiced = np.nonzero(np.abs(speech[OTHER]) > 0.01)[0]
    tv = np.tile(speech[OTHER][voiced[0]:voiced[-1] + 1], 6)  # no pause between the repeats
    h = hearing(whisper, wake_engine, end_of_turn=ender, command_timeout_s=3.0)
    events = run(h, np.concatenate([silence(0.5), speech[WAKE_COMMAND][:16000], tv]))
    ended = [e for e in events if isinstance(e, TurnEnded)]
    assert ended[0].reason in ("timeout", "heard")
    woke = events[0]
    assert isinstance(woke, Woke) and ended[0].time <= woke.detection.time + 3.0 + 0.05


def test_a_streamed_turn_ends_when_the_model_hears_its_end(whisper, wake_engine, speech, ender):
    h = hearing(whisper, wake_engine, end_of_turn=ender)
    h.stream_turns = lambda: True
    events = run(h, np.concatenate([silence(0.5), speech[WAKE_COMMAND], silence(3.0)]))
    ended = [e for e in events if isinstance(e, TurnEnded)]
    assert len(ended) == 1 and ended[0].reason == "ended", events
    streamed_s = sum(e.samples.size for e in events if isinstance(e, Streamed)) / 16000
    assert h.transcribing.stats.utterances == 0  # Home Assistant transcribes a streamed turn
    # Without the model the stream runs until Home Assistant ends it or the command timeout.
    plain = hearing(whisper, wake_engine)
    plain.stream_turns = lambda: True
    plain_events = run(plain, np.concatenate([silence(0.5), speech[WAKE_COMMAND], silence(3.0)]))
    assert [e.reason for e in plain_events if isinstance(e, TurnEnded)] == ["timeout"]
    assert streamed_s < sum(e.samples.size for e in plain_events if isinstance(e, Streamed)) / 16000


def test_a_click_while_a_pause_judged_incomplete_waits_ends_the_turn_not_its_deadline(
        whisper, wake_engine, mid_command, speech, ender):
    first, _ = mid_command
    voiced = np.nonzero(np.abs(speech[OTHER]) > 0.01)[0]
    click = speech[OTHER][voiced[0] + 8000:voiced[0] + 8000 + 1600]  # 100 ms: under min_utterance_ms
    audio = np.concatenate([silence(0.5), first, silence(0.7), click, silence(8.0)])
    events = run(hearing(whisper, wake_engine, end_of_turn=ender), audio)
    heard = [e for e in events if isinstance(e, Heard)]
    ended = [e for e in events if isinstance(e, TurnEnded)]
    assert len(heard) == 1 and "oven" in heard[0].transcript.text.lower(), events
    assert len(ended) == 1 and ended[0].reason == "heard"
    # The click was dropped as too short (after its hangover): the turn ends then, with what was said.
    click_end = heard[0].transcript.end + 0.7 + 0.1
    assert ended[0].time < click_end + VadSettings().hangover_ms / 1000 + 0.1, (ended, heard)
