"""Home Assistant MQTT discovery: the device and its entities as one device-level payload.

Published retained on `<ha_prefix>/device/<device id>/config` (Home Assistant
2024.11+ reads a whole device from one message: `dev`, `o`, `cmps`, each component
with its platform `p` and a `unique_id`). Every entity reads the device's own
topics (DESIGN.md's table), so nothing is published twice for Home Assistant:

| entity | platform | reads / writes |
|---|---|---|
| Say | notify | writes `<prefix>/<id>/ha/notify`; each message is an announcement |
| Status | sensor | `<prefix>/<id>/status` `state` |
| Queue | sensor | `<prefix>/<id>/status` `queued` |
| Engine | sensor | `<prefix>/<id>/announce/status` `engine` (the last announcement's) |
| Last transcript | sensor | `<prefix>/<id>/transcript` `text` |
| Wake word | event | `<prefix>/<id>/wake` (`event_type: detected`, with the phrase) |
| Volume | number | `<prefix>/<id>/ha/volume` (retained) and `.../set` |
| Microphone muted | switch | `<prefix>/<id>/ha/mic_mute` (retained) and `.../set` |

Availability is the retained status (and its last will). The notify entity's
command template gives each message an id when Home Assistant sends it, so a
redelivered message is the same announcement and is spoken once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_agent import __version__

ORIGIN = {"name": "edge-speech", "sw": __version__, "url": "https://github.com/edge-speech/edge-speech"}

NOTIFY_TEMPLATE = ('{"id": "ha-{{ now().timestamp() | replace(\'.\', \'-\') }}", '
                   '"text": {{ value | tojson }}}')
"""Rendered by Home Assistant once per message: the id is fixed before the message leaves it."""


@dataclass(frozen=True)
class HaTopics:
    """The topics Home Assistant's entities use for one device."""

    ha_prefix: str
    prefix: str
    device: str

    @property
    def discovery(self) -> str:
        return f"{self.ha_prefix}/device/{self.device}/config"

    @property
    def birth(self) -> str:
        """Home Assistant says `online` here when it (re)starts: discovery must be sent again."""
        return f"{self.ha_prefix}/status"

    def _own(self, leaf: str) -> str:
        return f"{self.prefix}/{self.device}/{leaf}"

    @property
    def notify(self) -> str:
        return self._own("ha/notify")

    @property
    def volume(self) -> str:
        return self._own("ha/volume")

    @property
    def volume_set(self) -> str:
        return self._own("ha/volume/set")

    @property
    def mic_mute(self) -> str:
        return self._own("ha/mic_mute")

    @property
    def mic_mute_set(self) -> str:
        return self._own("ha/mic_mute/set")

    @property
    def status(self) -> str:
        return self._own("status")

    def inbound(self) -> tuple[str, ...]:
        return (self.birth, self.notify, self.volume_set, self.mic_mute_set)


def discovery_payload(t: HaTopics, name: str | None = None) -> dict[str, Any]:
    """The device-level discovery document for `t.device`."""
    uid = f"edge_speech_{t.device}"

    def entity(key: str, platform: str, title: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        return f"{uid}_{key}", {"p": platform, "name": title, "unique_id": f"{uid}_{key}", **fields}

    components = dict([
        entity("say", "notify", "Say", command_topic=t.notify, command_template=NOTIFY_TEMPLATE,
               icon="mdi:bullhorn", qos=1),
        entity("status", "sensor", "Status", state_topic=t.status, value_template="{{ value_json.state }}",
               entity_category="diagnostic"),
        entity("queue", "sensor", "Queued announcements", state_topic=t.status,
               value_template="{{ value_json.queued | default(0) }}", state_class="measurement",
               icon="mdi:playlist-play"),
        entity("engine", "sensor", "Engine", state_topic=t._own("announce/status"),
               value_template="{{ value_json.engine if value_json.engine is defined else this.state }}",
               icon="mdi:server-network"),
        entity("transcript", "sensor", "Last transcript", state_topic=t._own("transcript"),
               value_template="{{ value_json.text[:255] }}", icon="mdi:text-to-speech"),
        entity("wake", "event", "Wake word", state_topic=t._own("wake"), event_types=["detected"],
               value_template='{"event_type": "detected", "wake_word": {{ value_json.wake_word | tojson }}}',
               icon="mdi:account-voice"),
        entity("volume", "number", "Volume", command_topic=t.volume_set, state_topic=t.volume,
               min=0, max=1, step=0.05, mode="slider", icon="mdi:volume-high", qos=1),
        entity("mic_mute", "switch", "Microphone muted", command_topic=t.mic_mute_set, state_topic=t.mic_mute,
               payload_on="ON", payload_off="OFF", icon="mdi:microphone-off", qos=1),
    ])
    return {
        "dev": {"ids": [uid], "name": name or t.device, "mf": "edge-speech", "mdl": "edge-agent",
                "sw": __version__},
        "o": ORIGIN,
        "availability": [{"topic": t.status, "value_template": "{{ value_json.state }}",
                          "payload_available": "online", "payload_not_available": "offline"}],
        "cmps": components,
        "qos": 1,
    }
