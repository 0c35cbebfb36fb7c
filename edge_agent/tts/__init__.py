"""Text-to-speech: sentence splitting, ONNX voices and the voice registry (normalisation: `text/`)."""
