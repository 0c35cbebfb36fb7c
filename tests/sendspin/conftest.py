"""The speech fixtures (the Piper voice, the Whisper export) for the ducking intelligibility test."""

from tests.speech_fixtures import *  # noqa: F403
