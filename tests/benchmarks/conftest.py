"""The real speech fixtures (the Whisper export) for the benches that need them (bench wyoming)."""

from tests.speech_fixtures import *  # noqa: F403
