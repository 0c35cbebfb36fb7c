"""Home Assistant over MQTT: discovery of the device and its entities, and what those entities send."""
