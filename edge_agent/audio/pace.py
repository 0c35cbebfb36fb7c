"""How long audio that arrives faster than real time has to wait before it is heard.

A live input sends a second of audio a second. One that sends faster (a Wyoming client
streaming a file, a recorder command gone wrong, a writer into the FIFO copying
`/dev/urandom`) would otherwise be heard as fast as it comes and keep a core busy for as
long as it sends. Each consumer holds such input to a bounded multiple of real time
with a `Pace` and waits the seconds it names; what is not read yet waits in the socket's
or the pipe's buffers (back-pressure: nothing is dropped).
"""

from __future__ import annotations


class Pace:
    """At most `speed` seconds of audio a second, after a head start of `burst_s` (a token bucket
    refilled at `speed`, holding at most `burst_s`): how long each piece of audio has to wait."""

    def __init__(self, speed: float, burst_s: float, now: float) -> None:
        self.speed = speed
        self.burst_s = burst_s
        self._credit_s = burst_s
        self._at = now

    def wait_s(self, audio_s: float, now: float) -> float:
        """Seconds to wait before hearing `audio_s` more seconds of audio that arrived at `now`."""
        self._credit_s = min(self.burst_s, self._credit_s + (now - self._at) * self.speed) - audio_s
        self._at = now
        return max(0.0, -self._credit_s / self.speed)
