"""A Sendspin player: the device plays Music Assistant's synchronized multiroom audio.

`settings` holds `sendspin.*`; `timeline` places decoded chunks on the stream's sample grid,
`playout` writes them to the output against the clock, `player` speaks the protocol through
`aiosendspin` (Python 3.12 or later, imported only when the player starts) and `cues` ducks
or pauses the music for what the device says and hears. The daemon hands it the output and
the shared controls; it loads nothing itself.
"""
