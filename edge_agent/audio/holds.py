"""Why a player's music is ducked or paused now: one set of reasons for each.

Both music players (the Sendspin player, the ESPHome media player's track player) are cued by the
daemon's `MusicCues` (an announcement spoken, a turn) and by their own controls (Home Assistant's
pause); the cues overlap, so each is held by its reason and released once: the music is ducked
while any duck reason is held and paused while any pause reason is. Pure state, no lock of its
own: the player guards it with the lock that guards what it plays.
"""

from __future__ import annotations

from typing import Literal

Hold = Literal["ducked", "paused"]


class Holds:
    """The reasons a player's music is ducked and paused; not thread-safe (see the module)."""

    def __init__(self, duck_level: float) -> None:
        self.duck_level = duck_level
        """The gain ducked music is scaled by."""
        self._reasons: dict[Hold, set[str]] = {"ducked": set(), "paused": set()}

    @property
    def ducked(self) -> bool:
        return bool(self._reasons["ducked"])

    @property
    def paused(self) -> bool:
        return bool(self._reasons["paused"])

    def hold(self, what: Hold, reason: str, *, on: bool) -> str | None:
        """Hold (`on`) or release `reason` for `what`; the change to say when that turned `what`
        on or off ("ducked", "no longer ducked"), else None (another reason holds it, or none)."""
        held = self._reasons[what]
        before = bool(held)
        if on:
            held.add(reason)
        else:
            held.discard(reason)
        if before == bool(held):
            return None
        return what if held else f"no longer {what}"

    def gain(self, level: float) -> float:
        """The music's gain at volume `level` (already curved and muted as the player does): none
        while paused, `duck_level` of it while ducked."""
        if self.paused:
            return 0.0
        return level * self.duck_level if self.ducked else level
