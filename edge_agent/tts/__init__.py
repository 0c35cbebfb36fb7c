"""Text-to-speech: normalisation, sentence splitting, ONNX voices and the voice registry."""
