"""Text that speaking and hearing share: normalisation (numbers, times, units in words) and WER."""
