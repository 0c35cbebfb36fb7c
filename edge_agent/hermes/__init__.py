"""Hermes, Rhasspy's MQTT protocol: `hermes/tts/say` as announcements, hotword and transcript events out."""
