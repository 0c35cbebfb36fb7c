"""Announcements, whatever triggers them: check, journal, queue, speak, report status.

`pipeline.Announcer` is the entry point: a trigger (the MQTT bridge today) calls
`submit` and watches `observe`; nothing here knows about MQTT.
"""
