"""deploy/k8s without a cluster: every overlay renders (in Python, and the same with kustomize where there is one),
every object validates against the Kubernetes schemas (strict), and the deployment's invariants hold. Its security
(privileges, secrets, network policies) is tests/test_deploy_security.py's."""
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

sys.path.insert(0, str(Path(__file__).parent))
from deploy_overlays import K8S, OVERLAYS, deployments, object_key, pod_specs, render, render_overlay  # noqa: E402

GPU_MAJOR = {"hopper": {"9"}, "blackwell": {"10", "12"}}
GPU_SERVICES = {"verifier", "benchmarker"}
#: the oldest Kubernetes the kubernetes-validate lower bound carries, and the newest installed
K8S_VERSIONS = ("1.31.0", kubernetes_validate.latest_version())


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, dict]:
    return request.param, render_overlay(request.param)


def test_the_python_renderer_matches_kustomize(overlay):
    name, objs = overlay
    if render.kustomize_binary() is None:
        pytest.skip("no kustomize or kubectl here: the Python rendering is validated on its own below")
    theirs = {object_key(o): o for o in render.render_with_binary(K8S / "overlays" / name)}
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
    deps = deployments(objs)
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
    for svc, dep in deployments(objs).items():
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
    bench = deployments(objs)["benchmarker"]
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
    for name, pod in pod_specs(objs):
        for c in pod.get("initContainers", []) + pod["containers"]:
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), (name, c["name"], kind)


def test_services_have_grpc_health_probes_on_the_health_port(overlay):
    _, objs = overlay
    config = objs[("ConfigMap", "kfactory", "kfactory-config")]["data"]
    port = int(config["KFACTORY_HEALTH_ADDR"].rsplit(":", 1)[1])
    assert Settings(health_addr=config["KFACTORY_HEALTH_ADDR"]).health_addr  # the setting parses
    for svc, dep in deployments(objs).items():
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


def test_every_workload_has_a_disruption_budget(overlay):
    _, objs = overlay
    pdbs = [o["spec"]["selector"]["matchLabels"] for k, o in objs.items() if k[0] == "PodDisruptionBudget"]
    for (kind, _, name), o in objs.items():
        if kind in ("Deployment", "StatefulSet"):
            labels = o["spec"]["template"]["metadata"]["labels"]
            assert any(sel.items() <= labels.items() for sel in pdbs), name
    nats = next(o for k, o in objs.items() if k[0] == "PodDisruptionBudget" and k[2] == "nats")
    assert nats["spec"]["maxUnavailable"] == 1  # two of three servers keep the JetStream quorum


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
    deps = deployments(objs)
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
    for svc, dep in deployments(objs).items():
        pod = dep["spec"]["template"]["spec"]
        assert str(pod["securityContext"]["runAsUser"]) == uid
        tag = pod["containers"][0]["image"].rsplit(":", 1)[1]
        assert tag == f"{version}-{'cuda' if name in GPU_MAJOR else 'cpu'}"
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert {"/tmp", "/var/lib/kfactory"} <= mounts  # the image's caches and data dir, on a read-only root
    assert "KFACTORY_DATA_DIR=/var/lib/kfactory" in docker and "HOME=/tmp" in docker


def test_the_services_that_run_kernels_get_a_shared_memory_filesystem_of_their_own(overlay):
    """The verifier's and the benchmarker's runner buffers live in /dev/shm (kfactory/sandbox/shm.py), which a
    container gets at 64 MiB, and so do the planner's probes of a cpu campaign's host (two 128 MiB buffers): each
    mounts a memory-backed emptyDir there: the verifier's and the benchmarker's of at least 1 GiB (a timing of four
    softmax 4096x4096 kernels), the planner's at least 256 MiB; each well under the container's memory limit, which
    its tmpfs pages count against (at the limit the container is killed before the volume is full, and the clear
    SharedMemoryFull error never comes)."""
    _, objs = overlay
    for svc, least in (("planner", 256 << 20), ("verifier", 1 << 30), ("benchmarker", 1 << 30)):
        pod = deployments(objs)[svc]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volume = next(v for v in pod["volumes"] if v["name"] == mounts["/dev/shm"])
        assert volume["emptyDir"]["medium"] == "Memory"
        size = _quantity(volume["emptyDir"]["sizeLimit"])
        assert least <= size <= _quantity(container["resources"]["limits"]["memory"]) // 2, (svc, size)


def _quantity(quantity: str) -> int:
    """A Kubernetes memory quantity in bytes (the binary suffixes these manifests use)."""
    for suffix, scale in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if quantity.endswith(suffix):
            return int(float(quantity[:-2]) * scale)
    return int(quantity)
