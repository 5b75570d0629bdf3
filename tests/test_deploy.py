"""deploy/k8s without a cluster: every overlay renders (in Python, and the same with kustomize where there is one),
every object validates against the Kubernetes schemas (strict), and the deployment's invariants hold."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from kfactory.bus import events as ev
from kfactory.agents import PERSONAS, persona_stage
from kfactory.platform.app import SERVICE_NAMES
from kfactory.bus.topology import WORK_STREAM
from kfactory.platform.config import Settings

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
sys.path.insert(0, str(K8S))
import render  # noqa: E402

OVERLAYS = ("local", "hopper", "blackwell")
GPU_MAJOR = {"hopper": {"9"}, "blackwell": {"10", "12"}}
GPU_SERVICES = {"verifier", "benchmarker"}
#: the oldest Kubernetes the kubernetes-validate lower bound carries, and the newest installed
K8S_VERSIONS = ("1.31.0", kubernetes_validate.latest_version())
SECRET_NAMES = {"kfactory-nats", "kfactory-redis", "kfactory-grpc"}
#: Secrets the operator creates only when wanted (the pods start without them): the LLM endpoint's key
OPTIONAL_SECRETS = {("kfactory-llm", "api-key")}
SECRETISH = re.compile(r"PASSWORD|TOKEN|SECRET|API_KEY|CREDENTIAL", re.I)


def _key(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, dict]:
    objects = render.render(K8S / "overlays" / request.param)
    by_key = {_key(o): o for o in objects}
    assert len(by_key) == len(objects), "two objects share a kind, namespace and name"
    return request.param, by_key


def _deployments(objs: dict) -> dict[str, dict]:
    return {k[2]: o for k, o in objs.items() if k[0] == "Deployment"}


def _pod_specs(objs: dict):
    for (kind, _, name), o in objs.items():
        if kind in ("Deployment", "StatefulSet"):
            yield name, o["spec"]["template"]["spec"]


def test_the_python_renderer_matches_kustomize(overlay):
    name, objs = overlay
    if render.kustomize_binary() is None:
        pytest.skip("no kustomize or kubectl here: the Python rendering is validated on its own below")
    theirs = {_key(o): o for o in render.render_with_binary(K8S / "overlays" / name)}
    assert theirs == objs


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay, version):
    _, objs = overlay
    checked = 0
    for key, obj in objs.items():
        if obj["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: validated structurally in test_keda_scaled_objects_reference_real_consumers
        kubernetes_validate.validate(obj, version, strict=True)
        checked += 1
    assert checked >= 30


def test_one_deployment_per_service_from_one_image(overlay):
    name, objs = overlay
    deps = _deployments(objs)
    assert set(deps) == set(SERVICE_NAMES)
    images = set()
    for svc, dep in deps.items():
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert c["args"] == ["serve", svc]
        images.add(c["image"])
    assert len(images) == 1
    assert images.pop().endswith("-cuda" if name in GPU_MAJOR else "-cpu")


def test_gpu_services_request_a_gpu_and_select_nodes_by_compute_capability(overlay):
    name, objs = overlay
    text = yaml.safe_dump(list(objs.values()))
    assert "gpu.family" not in text  # GPU Feature Discovery labels Blackwell's family as undefined
    for svc, dep in _deployments(objs).items():
        pod = dep["spec"]["template"]["spec"]
        res = pod["containers"][0]["resources"]
        gpus = {res["requests"].get("nvidia.com/gpu"), res["limits"].get("nvidia.com/gpu")}
        if name not in GPU_MAJOR or svc not in GPU_SERVICES:
            assert gpus == {None} and "tolerations" not in pod and "affinity" not in pod, svc
            continue
        assert gpus == {"1"}, svc
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        (expr,) = [e for t in terms for e in t["matchExpressions"]]
        assert expr["key"] == "nvidia.com/gpu.compute.major" and expr["operator"] == "In"
        assert set(expr["values"]) == GPU_MAJOR[name]


def test_one_benchmarker_per_gpu(overlay):
    """Each benchmarker pod holds exactly one whole GPU (the device plugin never shares one), and measures one
    candidate at a time; on the cpu, one benchmarker, so two measurements never share the cores."""
    name, objs = overlay
    bench = _deployments(objs)["benchmarker"]
    c = bench["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env.get("KFACTORY_WORKERS", "1") == "1"
    if name in GPU_MAJOR:
        assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert bench["spec"]["replicas"] >= 1
    else:
        assert bench["spec"]["replicas"] == 1


def test_every_container_has_requests_and_limits(overlay):
    _, objs = overlay
    for name, pod in _pod_specs(objs):
        for c in pod.get("initContainers", []) + pod["containers"]:
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), (name, c["name"], kind)


def test_services_have_grpc_health_probes_on_the_health_port(overlay):
    _, objs = overlay
    config = objs[("ConfigMap", "kfactory", "kfactory-config")]["data"]
    port = int(config["KFACTORY_HEALTH_ADDR"].rsplit(":", 1)[1])
    assert Settings(health_addr=config["KFACTORY_HEALTH_ADDR"]).health_addr  # the setting parses
    for svc, dep in _deployments(objs).items():
        c = dep["spec"]["template"]["spec"]["containers"][0]
        assert c["livenessProbe"]["grpc"] == {"port": port, "service": ""}, svc
        assert c["readinessProbe"]["grpc"] == {"port": port, "service": "ready"}, svc
        assert c["startupProbe"]["grpc"]["port"] == port, svc
        assert {"name": "health", "containerPort": port} in c["ports"]


def test_every_config_map_key_is_a_setting_the_services_read(overlay, monkeypatch):
    """kfactory-config holds only variables Settings reads (a misspelt or dead key would do nothing in a pod),
    and they parse: the level and the JSON lines of `serve`'s logs come from it."""
    from pydantic import AliasChoices

    from kfactory.cli.main import log_options

    _, objs = overlay
    config = objs[("ConfigMap", "kfactory", "kfactory-config")]["data"]
    names = set()
    for name, f in Settings.model_fields.items():
        alias = f.validation_alias
        names |= set(alias.choices) if isinstance(alias, AliasChoices) else {f"KFACTORY_{name.upper()}"}
    assert set(config) <= names, set(config) - names
    for key, value in config.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert log_options("serve", None, settings) == (config["KFACTORY_LOG_LEVEL"], True)
    assert settings.stream_replicas == int(config["KFACTORY_STREAM_REPLICAS"])


def test_no_privileged_pods(overlay):
    _, objs = overlay
    for name, pod in _pod_specs(objs):
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
    for name, pod in _pod_specs(objs):
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


def test_every_workload_has_a_disruption_budget(overlay):
    _, objs = overlay
    pdbs = [o["spec"]["selector"]["matchLabels"] for k, o in objs.items() if k[0] == "PodDisruptionBudget"]
    for (kind, _, name), o in objs.items():
        if kind in ("Deployment", "StatefulSet"):
            labels = o["spec"]["template"]["metadata"]["labels"]
            assert any(sel.items() <= labels.items() for sel in pdbs), name
    nats = next(o for k, o in objs.items() if k[0] == "PodDisruptionBudget" and k[2] == "nats")
    assert nats["spec"]["maxUnavailable"] == 1  # two of three servers keep the JetStream quorum


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


def test_nats_is_a_three_server_jetstream_cluster_on_volumes(overlay):
    _, objs = overlay
    sts = objs[("StatefulSet", "kfactory", "nats")]
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    ports = {p["name"]: p["containerPort"] for p in sts["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports == {"client": 4222, "cluster": 6222, "monitor": 8222}
    conf = objs[("ConfigMap", "kfactory", "nats-config")]["data"]["nats.conf"]
    assert "store_dir: /data/jetstream" in conf and "http: 0.0.0.0:8222" in conf
    assert conf.count("nats://nats-") == 3 and "include ./auth.conf" in conf
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    store = _bytes(env["JS_MAX_FILE_STORE"])
    volume = _bytes(sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"])
    assert 0.8 * volume <= store < volume  # JetStream stops before the volume is full
    config = objs[("ConfigMap", "kfactory", "kfactory-config")]["data"]
    assert int(config["KFACTORY_STREAM_REPLICAS"]) == 3


def _bytes(q: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Gi|Mi|GB|MB)", q)
    assert m is not None, q
    return float(m.group(1)) * {"Gi": 2 ** 30, "Mi": 2 ** 20, "GB": 1e9, "MB": 1e6}[m.group(2)]


def test_redis_wants_a_password_and_persists(overlay):
    _, objs = overlay
    sts = objs[("StatefulSet", "kfactory", "redis")]
    c = sts["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    conf = objs[("ConfigMap", "kfactory", "redis-config")]["data"]["redis.conf"]
    assert "appendonly yes" in conf and sts["spec"]["volumeClaimTemplates"]


def test_keda_scaled_objects_reference_real_consumers(overlay):
    name, objs = overlay
    scaled = {k[2]: o for k, o in objs.items() if k[0] == "ScaledObject"}
    if name == "local":
        assert not scaled  # kind and minikube have no KEDA by default
        return
    assert set(scaled) == {"coder", "compiler"}
    consumers = {"coder": {"coder", *(persona_stage(p) for p in PERSONAS)}, "compiler": {"compiler"}}
    deps = _deployments(objs)
    headless = objs[("Service", "kfactory", "nats-headless")]
    for svc, so in scaled.items():
        _check_scaled_object_shape(so)
        ref = so["spec"]["scaleTargetRef"]
        assert ref["kind"] == "Deployment" and ref["name"] in deps and deps[ref["name"]]["spec"]["template"][
            "spec"]["containers"][0]["args"] == ["serve", svc]
        seen = set()
        for t in so["spec"]["triggers"]:
            md = t["metadata"]
            assert t["type"] == "nats-jetstream" and md["stream"] == WORK_STREAM and md["account"] == "$G"
            assert md["consumer"] in set(ev.STAGES) | {persona_stage(p) for p in PERSONAS}
            seen.add(md["consumer"])
            host, port = md["natsServerMonitoringEndpoint"].rsplit(":", 1)
            assert host == f"nats-headless.{so['metadata']['namespace']}.svc.cluster.local"
            assert {"name": "monitor", "port": int(port), "targetPort": "monitor"} in headless["spec"]["ports"]
            assert int(md["lagThreshold"]) >= 1
        assert seen == consumers[svc]


def _check_scaled_object_shape(so: dict) -> None:
    """KEDA's ScaledObject (keda.sh/v1alpha1) is a CRD the Kubernetes schemas lack: its structure, checked here."""
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["kind"] == "ScaledObject"
    allowed = {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "idleReplicaCount", "minReplicaCount",
               "maxReplicaCount", "advanced", "triggers", "fallback", "initialCooldownPeriod"}
    spec = so["spec"]
    assert set(spec) <= allowed, set(spec) - allowed
    assert set(spec["scaleTargetRef"]) <= {"apiVersion", "kind", "name", "envSourceContainerName"}
    for k in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        assert isinstance(spec[k], int) and spec[k] >= 0, k
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert set(spec.get("advanced", {})) <= {"horizontalPodAutoscalerConfig", "restoreToOriginalReplicaCount",
                                             "scalingModifiers"}
    required = {"natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold"}
    optional = {"activationLagThreshold", "useHttps"}
    for t in spec["triggers"]:
        assert set(t) <= {"type", "metadata", "name", "authenticationRef", "metricType", "useCachedMetrics"}
        assert required <= set(t["metadata"]) <= required | optional
        assert all(isinstance(v, str) for v in t["metadata"].values())  # KEDA's metadata is map[string]string


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\ncommonLabels: {a: b}\n")
    with pytest.raises(render.UnsupportedKustomization, match="commonLabels"):
        render.render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text("resources: [d.yaml]\npatches: [{path: p.yaml, target: {kind: X}}]\n")
    (tmp_path / "d.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    (tmp_path / "p.yaml").write_text("- {op: replace, path: /data, value: {}}\n")
    with pytest.raises(render.PatchError, match="no object matches"):
        render.render(tmp_path)


def test_json_patch_operations():
    doc = {"a": {"b": [1, 2]}, "x/y": {}}
    render.json_patch(doc, {"op": "add", "path": "/a/b/-", "value": 3})
    render.json_patch(doc, {"op": "add", "path": "/a/b/0", "value": 0})
    render.json_patch(doc, {"op": "replace", "path": "/a/b/1", "value": 9})
    render.json_patch(doc, {"op": "add", "path": "/x~1y/k", "value": "v"})
    render.json_patch(doc, {"op": "remove", "path": "/a/b/3"})
    assert doc == {"a": {"b": [0, 9, 2]}, "x/y": {"k": "v"}}
    with pytest.raises(render.PatchError):
        render.json_patch(doc, {"op": "replace", "path": "/a/missing", "value": 1})


def test_the_image_serves_every_service_as_the_pods_run_it(overlay):
    """The Dockerfile's targets are the tags the overlays run; its user is the pods' runAsUser; `kfactory` is the
    entrypoint the Deployments' args (serve <name>) go to. (No engine runs here: `make image` builds it.)"""
    import tomllib

    name, objs = overlay
    docker = (K8S.parent.parent / "Dockerfile").read_text()
    targets = set(re.findall(r"(?m)^FROM \S+ AS (\w+)$", docker))
    assert {"cpu", "cuda"} <= targets
    assert docker.count('ENTRYPOINT ["kfactory"]') == 2
    (uid,) = set(re.findall(r"(?m)^USER (\d+):\d+$", docker))
    version = tomllib.loads((K8S.parent.parent / "pyproject.toml").read_text())["project"]["version"]
    for svc, dep in _deployments(objs).items():
        pod = dep["spec"]["template"]["spec"]
        assert str(pod["securityContext"]["runAsUser"]) == uid
        tag = pod["containers"][0]["image"].rsplit(":", 1)[1]
        assert tag == f"{version}-{'cuda' if name in GPU_MAJOR else 'cpu'}"
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert {"/tmp", "/var/lib/kfactory"} <= mounts  # the image's caches and data dir, on a read-only root
    assert "KFACTORY_DATA_DIR=/var/lib/kfactory" in docker and "HOME=/tmp" in docker


def test_make_secrets_creates_every_key_the_pods_read(overlay):
    _, objs = overlay
    script = (K8S / "make-secrets.sh").read_text()
    made = {(m.group(1), key) for m in re.finditer(r"(?m)^create (\S+) (.+)$", script) for key in m.group(2).split()}
    read = set()
    for _, pod in _pod_specs(objs):
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
