"""One module per `edge-agent` verb."""
