import pytest

from edge_agent.errors import ConfigError
from edge_agent.mqtt.topics import Topics, config_topic


def test_topics_follow_the_design_table():
    t = Topics("edge", "kitchen", "downstairs")
    assert t.subscriptions() == (
        "edge/kitchen/announce", "edge/group/downstairs/announce", "edge/all/announce",
        "edge/kitchen/config", "edge/group/downstairs/config", "edge/all/config",
    )
    assert t.announce_status == "edge/kitchen/announce/status"
    assert t.status == "edge/kitchen/status"
    assert t.transcript == "edge/kitchen/transcript"
    assert t.config_status == "edge/kitchen/config/status"
    assert t.metrics == "edge/kitchen/metrics"


def test_inbound_topics_are_classified_and_others_are_not_ours():
    t = Topics("edge", "kitchen", "downstairs")
    assert t.kind("edge/all/announce") == "announce"
    assert t.kind("edge/group/downstairs/config") == "config"
    assert t.kind("edge/group/upstairs/announce") is None
    assert t.kind("edge/hall/announce") is None


@pytest.mark.parametrize("device", ["all", "group"])
def test_device_ids_that_are_topic_levels_are_refused(device):
    with pytest.raises(ConfigError, match="reserved"):
        Topics("edge", device, "g")


def test_config_topic_of_each_target():
    assert config_topic("edge", "device:kitchen") == "edge/kitchen/config"
    assert config_topic("edge", "group:up") == "edge/group/up/config"
    assert config_topic("edge", "all") == "edge/all/config"
    with pytest.raises(ConfigError):
        config_topic("edge", "device:")
