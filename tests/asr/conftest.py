"""Speech fixtures (clips, noise, the exported Whisper) for these tests."""

from speech_fixtures import *  # noqa: F403
