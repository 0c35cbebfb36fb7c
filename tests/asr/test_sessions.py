"""The exported Whisper's onnxruntime sessions get the thread counts the settings ask for."""

import pytest

from edge_agent.asr.whisper import WhisperOnnx
from edge_agent.config import AsrSettings, ModelSettings


def intra_op_threads(session):
    return session.get_session_options().intra_op_num_threads


def test_decoder_threads_are_set_apart_from_the_encoders(whisper_dir):
    model = WhisperOnnx.from_settings(AsrSettings(model=str(whisper_dir), threads=2, decoder_threads=1),
                                      ModelSettings())
    assert intra_op_threads(model._encoder) == 2
    assert intra_op_threads(model._decoder) == 1


def test_decoder_threads_default_to_the_encoders_when_loading_directly(whisper_dir):
    model = WhisperOnnx.load(whisper_dir, "int8", threads=2)
    assert intra_op_threads(model._decoder) == 2


def test_decoder_threads_must_be_positive():
    with pytest.raises(ValueError, match="decoder_threads"):
        AsrSettings(decoder_threads=0)
