"""deploy/k8s's security without a cluster, in every overlay (tests/deploy_overlays.py renders them): no
privileged pods, no secret in plain text, every Secret key the pods read made by make-secrets.sh, and network
policies that let each service reach only what it must."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from kfactory.platform.app import SERVICE_NAMES

sys.path.insert(0, str(Path(__file__).parent))
from deploy_overlays import K8S, OPTIONAL_SECRETS, OVERLAYS, pod_specs, render_overlay  # noqa: E402

SECRET_NAMES = {"kfactory-nats", "kfactory-redis", "kfactory-grpc"}
SECRETISH = re.compile(r"PASSWORD|TOKEN|SECRET|API_KEY|CREDENTIAL", re.I)


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, dict]:
    return request.param, render_overlay(request.param)


def test_no_privileged_pods(overlay):
    _, objs = overlay
    for name, pod in pod_specs(objs):
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), name
        assert not any("hostPath" in v for v in pod.get("volumes", [])), name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod["automountServiceAccountToken"] is False, name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc.get("privileged") is not True and sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], (name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])


def test_no_plain_text_secrets(overlay):
    _, objs = overlay
    assert not [k for k in objs if k[0] == "Secret"], "secrets are created out of band (README), never rendered"
    refs = set()
    for name, pod in pod_specs(objs):
        for c in pod["containers"]:
            for e in c.get("env", []):
                if "valueFrom" in e:
                    ref = e["valueFrom"].get("secretKeyRef")
                    if ref:
                        refs.add(ref["name"])
                        assert ref.get("optional", False) == ((ref["name"], ref["key"]) in OPTIONAL_SECRETS), ref
                    continue
                if SECRETISH.search(e["name"]):
                    raise AssertionError(f"{name}: {e['name']} has a literal value")
                # a URL may carry a password only as a $(VAR) the kubelet expands from a Secret-backed variable
                assert not re.search(r"://[^/@\s]*:(?!\$\()[^/@\s]+@", e["value"]), (name, e)
    assert refs == SECRET_NAMES | {name for name, _ in OPTIONAL_SECRETS}
    for (kind, _, cname), o in objs.items():
        if kind == "ConfigMap":
            for key, text in o["data"].items():
                assert not SECRETISH.search(key), (cname, key)
                for m in re.finditer(r"password\s*:\s*(\S+)", text):
                    assert m.group(1).startswith("$"), (cname, key, m.group(0))


def _policy_for(objs: dict, app: str) -> dict:
    (pol,) = [o for k, o in objs.items() if k[0] == "NetworkPolicy"
              and o["spec"]["podSelector"].get("matchLabels") == {"app.kubernetes.io/name": app}]
    return pol


def _egress_apps(pol: dict) -> set[str]:
    out = set()
    for rule in pol["spec"].get("egress", []):
        for peer in rule["to"]:
            labels = peer.get("podSelector", {}).get("matchLabels", {})
            if "app.kubernetes.io/name" in labels:
                out.add(labels["app.kubernetes.io/name"])
            elif labels.get("k8s-app") == "kube-dns":
                out.add("dns")
            elif labels.get("kfactory.io/llm-endpoint") == "true":
                out.add("llm-endpoint")
            elif "ipBlock" in peer:
                out.add("internet:" + ",".join(str(p["port"]) for p in rule["ports"]))
    return out


def test_network_policies_allow_only_what_each_service_must_reach(overlay):
    _, objs = overlay
    deny = objs[("NetworkPolicy", "kfactory", "default-deny")]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"} \
        and "ingress" not in deny and "egress" not in deny
    must = {"planner": {"memory"}, "coder": {"memory", "internet:443", "llm-endpoint"}, "compiler": set(),
            "verifier": {"memory"}, "benchmarker": set(), "memory": set()}
    for svc, extra in must.items():
        assert _egress_apps(_policy_for(objs, svc)) == {"nats", "redis", "dns"} | extra, svc
    # spans leave every service for the collector the README names (OTEL_EXPORTER_OTLP_ENDPOINT), and only there
    otlp = objs[("NetworkPolicy", "kfactory", "otlp-egress")]["spec"]
    (expr,) = otlp["podSelector"]["matchExpressions"]
    assert expr["key"] == "app.kubernetes.io/name" and set(expr["values"]) == set(SERVICE_NAMES)
    assert otlp["policyTypes"] == ["Egress"] and "ingress" not in otlp
    (rule,) = otlp["egress"]
    assert rule["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 4317}]
    assert _egress_apps(_policy_for(objs, "redis")) == set()
    assert _egress_apps(_policy_for(objs, "nats")) == {"nats", "dns"}
    # the ports the policies open are the ones the services are configured to dial
    config = objs[("ConfigMap", "kfactory", "kfactory-config")]["data"]
    dialled = {app: int(config[key].rsplit(":", 1)[1].split("/")[0]) for app, key in
               (("nats", "KFACTORY_NATS_URL"), ("redis", "KFACTORY_REDIS_URL"), ("memory", "KFACTORY_MEMORY_ADDR"))}
    for svc in must:
        for rule in _policy_for(objs, svc)["spec"]["egress"]:
            apps = {p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") for p in rule["to"]}
            for app in apps & set(dialled):
                assert [p["port"] for p in rule["ports"]] == [dialled[app]], (svc, app, rule["ports"])


def test_make_secrets_creates_every_key_the_pods_read(overlay):
    _, objs = overlay
    script = (K8S / "make-secrets.sh").read_text()
    made = {(m.group(1), key) for m in re.finditer(r"(?m)^create (\S+) (.+)$", script) for key in m.group(2).split()}
    read = set()
    for _, pod in pod_specs(objs):
        for c in pod["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    read.add((ref["name"], ref["key"]))
    assert read == made
    # an optional Secret holds what only the operator has (an LLM key): the README says how to create it
    readme = (K8S / "README.md").read_text()
    for name, key in OPTIONAL_SECRETS:
        assert f"kubectl -n kfactory create secret generic {name} --from-literal={key}=" in readme
