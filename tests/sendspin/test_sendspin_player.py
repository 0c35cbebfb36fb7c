"""The real player against a real aiosendspin server on loopback: plays, in sync, survives."""

from __future__ import annotations

import asyncio
import logging
import socket

import numpy as np

from tests.sendspin.sendspin_skip import require_sendspin

require_sendspin()

from tests.sendspin.sendspin_support import (  # noqa: E402
    RATE,
    MusicServer,
    heard,
    locate,
    make_player,
    noise,
    place,
    until,
)


def test_a_stream_arrives_and_its_samples_land_on_the_output_timeline(tmp_path):
    source = noise(3.0, seed=1)

    async def scenario():
        player = make_player(tmp_path, "kitchen")
        await player.start()
        music = MusicServer()
        try:
            client = await music.join(player)
            started, stream = await music.stream([client], source)
            await until(lambda: player.playout.stats.blocks * 0.02 > 3.5, 20, "the music played out")
            stream.stop()
            return player, started
        finally:
            await music.close()
            await player.stop()

    player, started = asyncio.run(scenario())
    [out] = heard(player, tmp_path / "kitchen" / "out")
    at = place(out, source)
    assert at.peak > 0.999, f"the output is not the stream (correlation {at.peak:.3f})"
    count = len(source) - at.src - round(0.1 * RATE)  # all the rest of the stream
    played = out.samples[at.out:at.out + count]
    assert len(played) == count
    resyncs = player.playout.stats.resyncs
    if resyncs == 0:  # sample for sample
        wrong = np.nonzero(np.abs(played - source[at.src:at.src + count]) > 1e-3)[0]
        assert len(wrong) == 0, f"the output leaves the stream {wrong[0] / RATE:.3f} s in ({player.status()})"
    else:  # the clock filter moved more than the tolerance (a loaded machine): every piece is still
        # the stream, each where the clock put it, none further than sync allows
        starts = range(at.out, at.out + count - RATE // 4, RATE // 4)
        found = [(i, *locate(source, out.samples[i:i + RATE // 5])) for i in starts]
        exact = [(i, src) for i, src, peak in found if peak > 0.999]
        assert len(found) - len(exact) <= resyncs  # only a piece across a move may be mixed
        shifts = {i - src for i, src in exact}
        assert len(shifts) <= 1 + resyncs and max(abs(d - (at.out - at.src)) for d in shifts) < 0.02 * RATE
    first = np.nonzero(np.abs(out.samples) > 1e-3)[0][0]
    first_audio_s = (out.time_us(first) - started) / 1e6
    print(f"one player: first audio {first_audio_s:.3f} s after the stream started")
    assert 0.0 < first_audio_s < 1.0, f"first sample played {first_audio_s:.3f} s after the start"


def test_two_players_started_together_play_the_same_sample_at_the_same_time(tmp_path):
    source = noise(4.0, seed=2)

    async def scenario():
        players = [make_player(tmp_path, name) for name in ("kitchen", "lounge")]
        for player in players:
            await player.start()
        music = MusicServer()
        try:
            clients = [await music.join(player) for player in players]
            started, stream = await music.stream(clients, source)
            await until(lambda: all(p.playout.stats.blocks * 0.02 > 4.3 for p in players), 20,
                        "both players played it out")
            stream.stop()
            return players, started
        finally:
            await music.close()
            for player in players:
                await player.stop()

    players, started = asyncio.run(scenario())
    times = []
    for player in players:
        [out] = heard(player, tmp_path / player.name / "out")
        at = place(out, source)
        assert at.peak > 0.999, f"{player.name}: the output is not the stream ({at.peak:.3f})"
        times.append((out, at))
    common = max(at.src for _, at in times) + RATE  # a sample both played, a second in
    t1, t2 = (at.source_time_us(out, common) for out, at in times)
    apart_ms = abs(t1 - t2) / 1000
    firsts = [(out.time_us(np.nonzero(np.abs(out.samples) > 1e-3)[0][0]) - started) / 1e6 for out, _ in times]
    print(f"two players: sample {common} played {apart_ms:.3f} ms apart; first audio "
          f"{', '.join(f'{f:.3f}' for f in firsts)} s after the stream started")
    assert apart_ms < 20.0, f"the players are {apart_ms:.1f} ms apart"


def test_a_server_that_vanishes_mid_stream_leaves_the_player_working(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="edge_agent.sendspin")
    source = noise(3.0, seed=3)

    async def scenario():
        player = make_player(tmp_path, "kitchen")
        await player.start()
        try:
            first = MusicServer("first")
            client = await first.join(player)
            await until(lambda: player.status()["state"] == "connected", 10, "the status saying connected")

            async def vanish(block):
                if block == 40:
                    await until(lambda: player.state == "playing", 10, "playing")
                    await first.close()  # no stream/end, no goodbye: the connection just ends
                    return True
                return False

            await first.stream([client], source, on_block=vanish)
            await until(lambda: player.state == "idle", 10, "the player noticing")
            await until(lambda: len(player.playout.stats.segments) == 1 and player.playout.stream is None,
                        10, "the output closed")
            second = MusicServer("second")
            try:
                client = await second.join(player)
                _, stream = await second.stream([client], source[:RATE])
                await until(lambda: len(player.playout.stats.segments) == 2, 10, "a second segment")
                await until(lambda: player.state == "playing", 10, "playing again")
                stream.stop()
            finally:
                await second.close()
            return player
        finally:
            await player.stop()

    player = asyncio.run(scenario())
    assert "the server disconnected during a stream" in caplog.text
    outs = heard(player, tmp_path / "kitchen" / "out")
    assert place(outs[1], source).peak > 0.999  # the second server's music plays


def test_a_stalled_stream_closes_the_output_and_plays_again_when_audio_returns(tmp_path):
    source = noise(2.0, seed=4)

    async def scenario():
        player = make_player(tmp_path, "kitchen", stall_s=0.5)
        await player.start()
        music = MusicServer()
        try:
            client = await music.join(player)

            async def stall(block):
                if block == 50:  # the server stops sending but never ends the stream
                    await until(lambda: player.state == "stalled", 10, "the stall reported")
                    assert player.status()["error"] == "the stream stalled"
                return False

            _, stream = await music.stream([client], source, on_block=stall)
            await until(lambda: player.state == "playing" and len(player.playout.stats.segments) == 2, 10,
                        "playing again")
            stream.stop()
            return player
        finally:
            await music.close()
            await player.stop()

    player = asyncio.run(scenario())
    assert player.playout.stats.stalls == 1


def test_a_flood_of_volume_commands_moves_the_music_at_once_and_saves_the_last(tmp_path):
    from edge_agent.sendspin.player import LocalControls

    saved = []

    class Counted(LocalControls):
        def set_volume(self, volume):
            saved.append(volume)
            super().set_volume(volume)

    async def scenario():
        player = make_player(tmp_path, "kitchen")
        player.controls = Counted(volume=0.5)
        await player.start()
        music = MusicServer()
        try:
            client = await music.join(player)
            role = client.roles_by_family("player")[0]
            await until(lambda: "volume" in [str(c.value) for c in role.state_supported_commands], 10,
                        "the volume command offered")
            for i in range(2000):
                role.set_volume(i % 100)
            role.set_volume(37)
            await until(lambda: player.commands == 2001, 20, "every command handled")
            await until(lambda: saved and saved[-1] == 0.37, 10, "the last volume saved")
            return player
        finally:
            await music.close()
            await player.stop()

    player = asyncio.run(scenario())
    assert player.status()["volume"] == 37
    assert len(saved) <= 5, f"the shared volume was saved {len(saved)} times for one flood"
    assert abs(player.gain() - 0.37 ** 1.5) < 1e-9


def test_a_stream_in_a_format_we_cannot_decode_is_refused_with_a_status(tmp_path, caplog):
    from aiosendspin.client import AudioFormat, PCMFormat
    from aiosendspin.models.core import StreamStartMessage, StreamStartPayload
    from aiosendspin.models.player import StreamStartPlayer
    from aiosendspin.models.types import AudioCodec

    async def scenario():
        player = make_player(tmp_path, "kitchen")
        await player.start()
        try:
            # What a non-conforming server sends: FLAC to a player that offered PCM only.
            start = StreamStartMessage(payload=StreamStartPayload(player=StreamStartPlayer(
                codec=AudioCodec.FLAC, sample_rate=48000, channels=2, bit_depth=16)))
            player._on_stream_start(start)
            flac = AudioFormat(codec=AudioCodec.FLAC, pcm_format=PCMFormat(48000, 2, 16))
            for i in range(1000):
                player._on_chunk(i * 20_000, b"fLaC" + bytes(4000), flac, 0)
            return player, player.status()
        finally:
            await player.stop()

    player, status = asyncio.run(scenario())
    assert status["state"] == "unsupported format"
    assert "codec 'flac' is not decoded here" in status["error"]
    assert player.playout.stream is None and player.playout.stats.segments == []
    assert "the server sent a stream we cannot play" in caplog.text


def test_the_server_finds_the_player_by_zeroconf_and_connects_as_music_assistant_does(tmp_path):
    from tests.mdns_support import browse

    async def scenario():
        player = make_player(tmp_path, "kitchen speaker", zeroconf=True)
        await player.start()
        music = MusicServer()
        try:
            seen = await browse("_sendspin._tcp.local.", "kitchen speaker._sendspin._tcp.local.", 10)
            assert (seen.port, seen.properties["path"], seen.properties["name"]) == (
                player.port, "/sendspin", "kitchen speaker")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            await music.server.start_server(port=port, host="127.0.0.1", advertise_addresses=["127.0.0.1"],
                                            discover_clients=True)
            await until(lambda: music.server.get_client(player.client_id or "") is not None, 20,
                        "the server dialing the advertised player")
            await until(lambda: player.connected, 10, "the player connected")
        finally:
            await music.close()
            await player.stop()

    asyncio.run(scenario())


def test_a_format_change_mid_stream_plays_on_in_the_new_format(tmp_path):
    from aiosendspin.server import AudioCodec, AudioFormat

    source = noise(3.0, seed=5)

    async def scenario():
        player = make_player(tmp_path, "kitchen")
        await player.start()
        music = MusicServer()
        try:
            client = await music.join(player)
            role = client.roles_by_family("player")[0]

            async def switch(block):
                if block == 60:
                    await until(lambda: player.state == "playing", 10, "playing")
                    assert role.set_preferred_format(AudioFormat(44100, 24, 1), AudioCodec.PCM)
                return False

            _, stream = await music.stream([client], source, on_block=switch)
            await until(lambda: any(s.rate == 44100 for s in player.playout.stats.segments), 10,
                        "a 44.1 kHz segment")
            stream.stop()
            return player
        finally:
            await music.close()
            await player.stop()

    player = asyncio.run(scenario())
    rates = [s.rate for s in player.playout.stats.segments]
    assert rates[0] == RATE and rates[-1] == 44100
