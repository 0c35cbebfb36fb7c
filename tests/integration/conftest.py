"""Speech fixtures (clips, noise, the exported Whisper) for these tests; the broker and its
watchers come from the suite's conftest."""

from tests.speech_fixtures import *  # noqa: F403
