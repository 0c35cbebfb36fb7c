"""Speech fixtures (clips, noise, the exported Whisper) and MQTT watchers for these tests."""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.mqtt_support import Producer, Watcher
from tests.speech_fixtures import *  # noqa: F403


@pytest.fixture
def everything(broker: Any) -> Iterator[Watcher]:
    """Every message on the broker, from the start of the test."""
    w = Watcher(broker.url, topic="#")
    yield w
    w.close()


@pytest.fixture
def producer(broker: Any) -> Iterator[Producer]:
    p = Producer(broker.url)
    yield p
    p.close()
