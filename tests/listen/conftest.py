"""Speech fixtures (clips, noise, the Piper voice) for these tests."""

from speech_fixtures import *  # noqa: F403
