"""edge-export: real PyTorch speech models to ONNX, quantized by measurement, with parity manifests."""
