"""Music and voice: ducking and pausing measured on the player's output timeline."""

from __future__ import annotations

import asyncio

from tests.sendspin.sendspin_skip import require_sendspin

require_sendspin()

from edge_agent.listen.hearing import TurnEnded, Woke  # noqa: E402
from edge_agent.sendspin.cues import MusicCues  # noqa: E402
from tests.sendspin.sendspin_support import (  # noqa: E402
    MusicServer,
    heard,
    make_player,
    rms_at,
    tone,
    until,
)

FULL = 0.5 / 2 ** 0.5  # the tone's RMS at volume 100


def test_an_announcement_ducks_the_music_to_the_set_level_and_restores_it(tmp_path):
    marks = {}

    async def scenario():
        player = make_player(tmp_path, "kitchen", duck_level=0.2)
        cues = MusicCues()
        cues.players.append(player)
        await player.start()
        music = MusicServer()
        try:
            client = await music.join(player)
            streaming = asyncio.create_task(music.stream([client], tone(4.0)))
            await until(lambda: player.playout.stats.audio_blocks > 25, 20, "half a second of music")
            marks["duck"] = player.playout.clock_us()
            cues.on_announce_status({"id": "a1", "state": "speaking"})
            await until(lambda: player.playout.clock_us() > marks["duck"] + 800_000, 20, "0.8 s ducked")
            marks["restore"] = player.playout.clock_us()
            cues.on_announce_status({"id": "a1", "state": "done"})
            await until(lambda: player.playout.clock_us() > marks["restore"] + 800_000, 20, "0.8 s restored")
            _, stream = await streaming
            stream.stop()
            return player
        finally:
            await music.close()
            await player.stop()

    player = asyncio.run(scenario())
    [out] = heard(player, tmp_path / "kitchen" / "out")
    before = rms_at(out, marks["duck"] - 200_000, 0.15)
    ducked = rms_at(out, marks["duck"] + 100_000, 0.5)
    after = rms_at(out, marks["restore"] + 100_000, 0.5)
    print(f"ducking: before {before:.4f}, ducked {ducked:.4f} ({ducked / before:.3f}), after {after:.4f}")
    assert abs(before - FULL) < 0.01 * FULL
    assert abs(ducked / before - 0.2) < 0.01
    assert abs(after - before) < 0.01 * FULL


def test_a_wake_word_pauses_the_music_until_the_turn_ends_and_it_returns_in_sync(tmp_path):
    marks = {}

    async def scenario():
        player = make_player(tmp_path, "kitchen")
        cues = MusicCues(pause_on_wake=True)
        cues.players.append(player)
        await player.start()
        music = MusicServer()
        try:
            client = await music.join(player)
            streaming = asyncio.create_task(music.stream([client], tone(4.0)))
            await until(lambda: player.playout.stats.audio_blocks > 25, 20, "half a second of music")
            marks["wake"] = player.playout.clock_us()
            cues.woke(Woke(detection=None, conversation_id="c1"))  # type: ignore[arg-type]
            assert player.status()["paused"]
            await until(lambda: player.playout.clock_us() > marks["wake"] + 800_000, 20, "0.8 s paused")
            marks["end"] = player.playout.clock_us()
            cues.turn_ended(TurnEnded("c1", "heard", 0.0))
            await until(lambda: player.playout.clock_us() > marks["end"] + 800_000, 20, "0.8 s again")
            _, stream = await streaming
            stream.stop()
            return player
        finally:
            await music.close()
            await player.stop()

    player = asyncio.run(scenario())
    [out] = heard(player, tmp_path / "kitchen" / "out")  # one segment: the timeline ran on
    assert rms_at(out, marks["wake"] + 100_000, 0.5) == 0.0
    assert abs(rms_at(out, marks["end"] + 100_000, 0.5) - FULL) < 0.01 * FULL
    assert not player.status()["paused"]
