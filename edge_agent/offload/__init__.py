"""Offload: heavy synthesis on a server, spoken on the device. Cut by side:

- `wire/`: the protocol both sides speak and nothing else: frames (`framing`), typed messages
  (`messages`), audio codecs (`codecs`), the key exchange and key loading (`auth`), framed
  connections and TLS contexts (`transport`). It imports neither side.
- `client/`: the device's side: the connection to one server (`connection`), a stream read
  sentence by sentence (`stream`), the circuit breaker (`breaker`), several servers (`servers`) and
  the `Synthesizer` that routes between them and the local voice (`router`).
- `server/`: `edge-agent serve`: connections and sessions (`synth_server`), handshake admission
  (`admission`), the synthesis workers (`scheduler`), its numbers (`server_metrics`) and their HTTP
  face, Prometheus and probes (`http_monitor`).

The client and the server sides never import each other; both import `wire/`.

Public means the three side packages themselves: code outside `offload/` imports only
`edge_agent.offload.wire`, `edge_agent.offload.client` or `edge_agent.offload.server`, each of
which names its entry points in `__all__`, and `edge_agent.offload.settings`, both sides'
settings sections (`offload` and `server`), which `config` assembles without loading either
side. The modules inside them are internal and may change shape; tests and benchmarks, which
measure those internals, are the exception.
`tests/test_architecture.py` holds the package to these rules.
"""
