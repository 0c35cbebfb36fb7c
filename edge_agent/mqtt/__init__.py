"""MQTT transport: the broker connection, the topic layout and a local broker for tests and benchmarks."""
