from pathlib import Path

from edge_agent.text.wer import wer
from exporters.asr_reference import torch_fp32


def test_the_pytorch_reference_transcribes_a_clip_from_the_ct2_weights(tiny_en_dir: Path, clips):
    transcribe = torch_fp32(tiny_en_dir, 2)
    assert wer([clips[0].text], [transcribe(clips[0].audio())]) == 0.0
