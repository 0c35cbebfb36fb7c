"""onnxruntime as the runtime uses it: which execution providers each use runs on (`settings`,
`providers`) and how sessions are made and share memory (`sessions`)."""
