"""Fleet management: signed config envelopes, atomic apply with rollback, model updates."""
