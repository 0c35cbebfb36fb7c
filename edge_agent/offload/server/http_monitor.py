"""The server's HTTP side: Prometheus metrics on `/metrics`, probes on `/ready` and `/live`.

Served on the server's own event loop, so `/live` answering means that loop
runs. `/ready` is 200 only between "voices loaded and listening" and the start
of a drain: a Kubernetes readiness probe then takes a draining pod out of its
Service (and out of the headless Service's DNS answer) while open streams finish.

Metrics are read from `ServerMetrics` at scrape time by a custom collector, so
each number has one source. prometheus-client is the `server` extra: a device
never imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from edge_agent.errors import TIMEOUTS, ConfigError
from edge_agent.offload.server.server_metrics import ServerMetrics

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)

PREFIX = "edge_serve"
MAX_REQUEST_BYTES = 8192
"""Request line and headers; a scrape or probe needs a few hundred."""
REQUEST_TIMEOUT_S = 5.0


class ServerCollector:
    """Turns a `ServerMetrics` snapshot into Prometheus metric families at each scrape."""

    def __init__(self, metrics: ServerMetrics, ready: Monitor) -> None:
        self.metrics = metrics
        self.monitor = ready

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        snap = self.metrics.snapshot()
        counters: dict[str, int] = snap["counters"]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        c = counters.get
        yield counter("requests", "Synthesis requests accepted (streams opened).", c("requests", 0))
        yield counter("connections", "Client connections accepted.", c("connections", 0))
        yield counter("auth_failures", "Handshakes that failed authentication.", c("auth_failures", 0))
        yield counter("protocol_errors", "Connections closed on a protocol error.", c("protocol_errors", 0))
        yield counter("busy", "BUSY answers: streams refused on a full queue, connections over the limit.",
                      c("rejected_busy", 0) + c("rejected_connections", 0))
        rejected = CounterMetricFamily(f"{PREFIX}_rejected", "Streams refused, by error code.",
                                       labels=["code"])
        outcomes = CounterMetricFamily(f"{PREFIX}_streams", "Streams ended, by outcome.", labels=["outcome"])
        for key, value in sorted(counters.items()):
            if key.startswith("rejected_") and key != "rejected_connections":
                rejected.add_metric([key.removeprefix("rejected_")], value)
            elif key.startswith("streams_"):
                outcomes.add_metric([key.removeprefix("streams_")], value)
        yield rejected
        yield outcomes
        yield counter("audio_seconds", "Seconds of audio synthesized.", snap["audio_s"])
        yield counter("synthesis_seconds", "Seconds spent synthesizing.", snap["synth_s"])
        yield gauge("active_connections", "Open client connections.", snap["connections"])
        yield gauge("active_streams", "Open streams.", snap["streams"])
        yield gauge("queue_depth", "Sentences waiting for a synthesis worker.", snap["queue_depth"])
        yield gauge("in_flight", "Sentences being synthesized now.", snap["in_flight"])
        yield gauge("ready", "1 when voices are loaded and the server is not draining.",
                    1.0 if self.monitor.ready else 0.0)
        hists = self.metrics.histograms()
        for key, name, doc in (
                ("first_audio", "first_audio_seconds", "Request arrival to its first audio frame sent."),
                ("sentence", "sentence_seconds", "Synthesis time per sentence."),
                ("rtf", "real_time_factor", "Synthesis seconds per second of audio, per sentence.")):
            buckets = hists[key]
            total = hists[f"{key}_sum"]
            assert isinstance(buckets, list) and isinstance(total, float)
            yield HistogramMetricFamily(f"{PREFIX}_{name}", doc,
                                        buckets=[(_bound(b), n) for b, n in buckets], sum_value=total)


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(value)


class Monitor:
    """GET `/metrics`, `/ready`, `/live` on an HTTP port of the server's event loop."""

    def __init__(self, metrics: ServerMetrics, host: str, port: int) -> None:
        try:
            from prometheus_client import CollectorRegistry
        except ImportError:
            raise ConfigError("server.metrics_port: needs prometheus-client "
                              "(pip install 'edge-speech[server]')") from None
        self.host = host
        self.port = port
        self.ready = False
        """Set once the voices are loaded and the server listens; cleared when it drains."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServerCollector(metrics, self))
        self._server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        try:
            self._server = await asyncio.start_server(self._handle, self.host, self.port,
                                                      limit=MAX_REQUEST_BYTES)
        except OSError as exc:
            raise ConfigError(f"server.metrics_port: cannot listen on {self.host}:{self.port} "
                              f"({exc.strerror or exc})") from None
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(*TIMEOUTS):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            status, ctype, body = self._answer(head)
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, TimeoutError, asyncio.TimeoutError,
                ConnectionError):
            status, ctype, body = "400 Bad Request", "text/plain", b"bad request\n"
        try:
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + body)
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        except (TimeoutError, asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, head: bytes) -> tuple[str, str, bytes]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return "400 Bad Request", "text/plain", b"bad request\n"
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method != b"GET":
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        if target == b"/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if target == b"/live":
            return "200 OK", "text/plain", b"live\n"
        if target == b"/ready":
            if self.ready:
                return "200 OK", "text/plain", b"ready\n"
            return "503 Service Unavailable", "text/plain", b"not ready\n"
        return "404 Not Found", "text/plain", b"not found\n"
