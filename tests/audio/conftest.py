"""Speech fixtures (clips, noise, the exported Whisper) for these tests."""

from tests.speech_fixtures import *  # noqa: F403
