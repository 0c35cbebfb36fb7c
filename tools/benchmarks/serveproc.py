"""`edge-agent serve` as a child process on a free port: for benchmarks and tests that kill servers."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import urllib.error
import urllib.request

LISTENING = re.compile(r"listening on (\w+)://([\d.]+):(\d+)")
METRICS = re.compile(r"metrics on (http://\S+)/metrics")


class ServeProcess:
    """Started with `args` after `serve --port 0`; `uri` and (with a metrics port) `http` once it listens."""

    def __init__(self, args: list[str], env: dict[str, str], timeout: float = 120) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "edge_agent", "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **env})
        assert self.proc.stdout is not None
        # The first line says where it listens; EOF (it died) also wakes the select, so a child
        # that hangs before printing costs `timeout`, not forever.
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        match = LISTENING.search(line)
        if not match:
            self.proc.kill()
            stderr = self.proc.stderr.read()[-2000:] if self.proc.stderr else ""
            raise RuntimeError(f"serve did not start: {line!r} {stderr}")
        self.line = line
        """The line it printed when it started listening (voices, their models and providers)."""
        self.uri = f"{match[1]}://{match[2]}:{match[3]}"
        self.port = int(match[3])
        metrics = METRICS.search(line)
        self.http = metrics[1] if metrics else None
        """Base URL of the metrics and probe port, when `server.metrics_port` is set."""

    def scrape(self) -> dict[str, float]:
        """Every sample on `/metrics` (needs prometheus-client, the `server` extra)."""
        from prometheus_client.parser import text_string_to_metric_families

        if self.http is None:
            raise RuntimeError("serve was started without server.metrics_port")
        try:
            with urllib.request.urlopen(f"{self.http}/metrics", timeout=10) as answer:
                text = answer.read().decode()
        except urllib.error.URLError as exc:
            raise RuntimeError(f"cannot scrape {self.http}: {exc}") from None
        return {sample.name: sample.value for family in text_string_to_metric_families(text)
                for sample in family.samples if not sample.labels}

    def kill(self) -> None:
        """SIGKILL: the connection drops without GOAWAY, as with a crash or a power cut."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 20) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        self.kill()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe:
                pipe.close()
