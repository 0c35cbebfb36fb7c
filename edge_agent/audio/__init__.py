"""Audio in and out: sources, sinks, WAV files, resampling."""
