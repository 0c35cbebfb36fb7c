"""packaging/k8s, checked offline: each manifest against the Kubernetes OpenAPI schema (strict), the
kustomization rendered by kubectl, and the manifests agreeing with each other and with the server."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from edge_agent.cli import build_parser
from edge_agent.config import load_settings
from tests.conftest import REPO

K8S = REPO / "packaging" / "k8s"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
VERSIONS = ("1.29", kubernetes_validate.latest_version())
"""The oldest Kubernetes release still in common service we target, and the newest schema known."""


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def resources() -> dict[str, dict]:
    out = {}
    for path in MANIFESTS:
        for doc in documents(path):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_matches_the_kubernetes_schema_strictly(path, version):
    for doc in documents(path):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_catches_a_misspelt_field():
    deployment = copy.deepcopy(resources()["Deployment/edge-serve"])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/ready"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_renders_the_kustomization_offline():
    rendered = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60,
                              check=True).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered) if d)
    assert kinds == sorted(["Namespace", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                            "HorizontalPodAutoscaler"])


def test_the_manifests_agree_with_each_other_and_with_the_server(tmp_path):
    r = resources()
    deployment, service = r["Deployment/edge-serve"], r["Service/edge-serve"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert r["PodDisruptionBudget/edge-serve"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert r["HorizontalPodAutoscaler/edge-serve"]["spec"]["scaleTargetRef"]["name"] == "edge-serve"
    # Headless, and only ready pods in the DNS answer: devices spread over every ready pod.
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is False

    config_file = tmp_path / "server.yaml"
    config_file.write_text(r["ConfigMap/edge-serve-config"]["data"]["server.yaml"])
    server = load_settings(config_file, env={}).server  # the keys exist and validate
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"offload": server.port, "metrics": server.metrics_port}
    for probe, path in (("startupProbe", "/ready"), ("readinessProbe", "/ready"), ("livenessProbe", "/live")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}
    # SIGTERM -> GOAWAY -> drain must end before the kubelet's SIGKILL.
    assert pod["terminationGracePeriodSeconds"] > server.shutdown_grace_s
    # The secrets are mounted where the config reads them.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert str(server.psk_file).startswith(mounts["psk"] + "/")
    assert str(server.tls_cert).startswith(mounts["tls"] + "/")
    assert str(server.tls_key).startswith(mounts["tls"] + "/")
    assert str(config_file.name) in mounts["config"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "serve" and Path(args.config) == Path(mounts["config"])
