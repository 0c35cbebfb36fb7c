"""Speech fixtures (the shared model cache) for these tests."""

from tests.speech_fixtures import *  # noqa: F403
