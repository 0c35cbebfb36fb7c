"""`mqtt.hearing.HearPublisher`: what the device heard, as the `wake` and `transcript` payloads."""

import json

import numpy as np

from edge_agent.asr.transcriber import Transcript
from edge_agent.listen.hearing import Heard, Streamed, TurnEnded, Woke
from edge_agent.listen.turn import RemoteHeard
from edge_agent.mqtt.hearing import HearPublisher
from edge_agent.mqtt.topics import Topics
from edge_agent.wake.engine import Detection


def publisher():
    sent = []
    topics = [Topics("edge", "dev1", "kitchen")]
    return HearPublisher(sent.append, lambda: topics[0]), sent, topics


def test_a_wake_word_and_a_command_are_published_with_qos_1_and_their_conversation():
    hear, sent, _ = publisher()
    hear.woke(Woke(Detection("okay_nabu", "Okay Nabu", 3.2, 0.97), "c1"))
    hear.heard(Heard(Transcript("what time is it", 3.4, 4.5), "c1", "Okay Nabu"))
    assert [(m.topic, m.qos, m.retain) for m in sent] == [("edge/dev1/wake", 1, False),
                                                          ("edge/dev1/transcript", 1, False)]
    wake, transcript = (json.loads(m.payload) for m in sent)
    assert wake["wake_word"] == "Okay Nabu" and wake["conversation_id"] == "c1" and wake["ts"] > 0
    assert {k: transcript[k] for k in ("text", "start", "end", "conversation_id", "wake_word")} == {
        "text": "what time is it", "start": 3.4, "end": 4.5, "conversation_id": "c1",
        "wake_word": "Okay Nabu"}
    assert "continued" not in transcript


def test_a_continued_command_says_so_and_keeps_its_conversation():
    hear, sent, _ = publisher()
    hear.heard(Heard(Transcript("dinner is ready", 3.4, 4.5), "c1", "Okay Nabu", early=True))
    hear.heard(Heard(Transcript("dinner is ready please come", 3.4, 5.9), "c1", "Okay Nabu", continued=True))
    first, second = (json.loads(m.payload) for m in sent)
    assert "continued" not in first
    assert second["continued"] is True and second["conversation_id"] == "c1"
    assert second["text"] == "dinner is ready please come"


def test_a_transcript_outside_a_turn_has_no_conversation_and_home_assistant_s_has_no_times():
    hear, sent, _ = publisher()
    hear.heard(Heard(Transcript("hello", 0.0, 1.0)))
    hear.remote_heard(RemoteHeard("lights on", "c2", "Okay Nabu"))
    always, remote = (json.loads(m.payload) for m in sent)
    assert "conversation_id" not in always and "wake_word" not in always
    assert "start" not in remote and "end" not in remote
    assert remote["source"] == "home-assistant" and remote["conversation_id"] == "c2"


def test_topics_are_read_at_each_message_and_audio_and_turn_ends_publish_nothing():
    hear, sent, topics = publisher()
    hear.streamed(Streamed(np.zeros(160, dtype=np.float32), "c1"))
    hear.turn_ended(TurnEnded("c1", "heard", 4.8))
    assert sent == []
    topics[0] = Topics("other", "dev1", "kitchen")  # a reload replaced them
    hear.heard(Heard(Transcript("hello", 0.0, 1.0)))
    assert sent[0].topic == "other/dev1/transcript"
