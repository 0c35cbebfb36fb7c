"""Speech recognition: Whisper exported to ONNX, run with numpy and onnxruntime (no torch)."""
