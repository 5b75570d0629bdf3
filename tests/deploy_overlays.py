"""The rendered deploy/k8s overlays that tests/test_deploy.py and tests/test_deploy_security.py check: each
overlay's objects by (kind, namespace, name), rendered by deploy/k8s/render.py (no cluster, no kustomize needed).

Each test module renders the overlays once, with a fixture of its own:
    @pytest.fixture(scope="module", params=OVERLAYS)
    def overlay(request) -> tuple[str, dict]:
        return request.param, render_overlay(request.param)
"""
from __future__ import annotations

import sys
from pathlib import Path

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
sys.path.insert(0, str(K8S))
import render  # noqa: E402

OVERLAYS = ("local", "hopper", "blackwell")
#: Secrets the operator creates only when wanted (the pods start without them): the LLM endpoint's key
OPTIONAL_SECRETS = {("kfactory-llm", "api-key")}

__all__ = ["K8S", "OPTIONAL_SECRETS", "OVERLAYS", "deployments", "object_key", "pod_specs", "render",
           "render_overlay"]


def object_key(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def render_overlay(name: str) -> dict:
    """The objects of overlay `name`, by object_key(); no two objects may share one."""
    objects = render.render(K8S / "overlays" / name)
    by_key = {object_key(o): o for o in objects}
    assert len(by_key) == len(objects), "two objects share a kind, namespace and name"
    return by_key


def deployments(objs: dict) -> dict[str, dict]:
    return {k[2]: o for k, o in objs.items() if k[0] == "Deployment"}


def pod_specs(objs: dict):
    for (kind, _, name), o in objs.items():
        if kind in ("Deployment", "StatefulSet"):
            yield name, o["spec"]["template"]["spec"]
