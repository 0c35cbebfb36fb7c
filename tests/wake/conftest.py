"""Speech fixtures (clips, noise, the Piper voice) for these tests."""

from tests.speech_fixtures import *  # noqa: F403
