"""MQTT: the broker connection, the topic layout and announcements."""
