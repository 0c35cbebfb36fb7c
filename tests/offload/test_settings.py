"""Offload settings: `offload.server` and `offload.servers` are one list of servers."""

from __future__ import annotations

import pytest

from edge_agent.config import OffloadSettings, load_settings
from edge_agent.errors import ConfigError

A, B = "tcp://127.0.0.1:10701", "tcp://127.0.0.1:10702"


def test_policy_remote_with_only_servers_loads():
    settings = load_settings(overrides={"offload.policy": "remote", "offload.servers": [A, B]}, env={})
    assert settings.offload.targets == (A, B)
    assert settings.offload.offloads


def test_server_and_servers_form_one_list_server_first_each_once():
    assert OffloadSettings(server=B, servers=(A, B)).targets == (B, A)


def test_policy_local_or_no_server_never_offloads():
    assert not OffloadSettings(servers=(A,), policy="local").offloads
    assert not OffloadSettings().offloads


def test_policy_remote_without_any_server_is_refused_naming_both_keys():
    with pytest.raises(ConfigError, match=r"needs offload\.server or offload\.servers"):
        load_settings(overrides={"offload.policy": "remote"}, env={})
