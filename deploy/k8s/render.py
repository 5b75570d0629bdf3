"""Render a kustomization to a list of Kubernetes objects: `kustomize build` / `kubectl kustomize` when one is on
PATH, else a pure-Python renderer of the subset of kustomize these manifests use.

The subset: `resources` (files and directories with their own kustomization), `namespace`, `configMapGenerator`
with `files` under `generatorOptions.disableNameSuffixHash: true`, `images` (newName, newTag), and `patches` that
are JSON 6902 operation lists (add, replace, remove) chosen by `target` kind and name (a regular expression).
Anything else in a kustomization raises UnsupportedKustomization, so the renderer never silently differs from
kustomize; tests/test_deploy.py checks both renderings agree wherever a kustomize binary exists.

    python deploy/k8s/render.py deploy/k8s/overlays/hopper [--python]
"""
from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "configMapGenerator", "generatorOptions", "images",
             "patches"}
#: kinds that are not namespaced among those used here (kustomize leaves their metadata.namespace unset)
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PersistentVolume",
                  "StorageClass", "PriorityClass", "RuntimeClass"}


class UnsupportedKustomization(ValueError):
    """The kustomization uses a feature outside the renderer's subset; the message names it."""


class PatchError(ValueError):
    """A JSON 6902 operation does not apply to its target."""


def kustomize_binary() -> list[str] | None:
    """The command that builds a kustomization, or None when neither kustomize nor kubectl is on PATH."""
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def render_with_binary(path: Path) -> list[dict]:
    """Objects from the kustomize binary (kustomize build or kubectl kustomize)."""
    cmd = kustomize_binary()
    if cmd is None:
        raise FileNotFoundError("neither kustomize nor kubectl is on PATH")
    out = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=120, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def render(path: Path) -> list[dict]:
    """Objects of the kustomization directory `path`, rendered in Python."""
    path = Path(path)
    kfile = path / "kustomization.yaml"
    k = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(k) - SUPPORTED
    if unknown:
        raise UnsupportedKustomization(f"{kfile}: {sorted(unknown)} not supported by render.py")
    objects: list[dict] = []
    for res in k.get("resources", []):
        target = (path / res).resolve()
        objects += render(target) if target.is_dir() else _load(target)
    objects += _generated(path, k)
    for patch in k.get("patches", []):
        _apply_patch(path, patch, objects)
    for image in k.get("images", []):
        _set_image(objects, image)
    if "namespace" in k:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = k["namespace"]
    return objects


def _load(file: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(file.read_text()) if d]


def _generated(path: Path, k: dict) -> list[dict]:
    gens = k.get("configMapGenerator", [])
    if gens and not (k.get("generatorOptions") or {}).get("disableNameSuffixHash"):
        raise UnsupportedKustomization("configMapGenerator without disableNameSuffixHash: true (name hashes)")
    out = []
    for gen in gens:
        unknown = set(gen) - {"name", "files"}
        if unknown:
            raise UnsupportedKustomization(f"configMapGenerator {gen.get('name')}: {sorted(unknown)}")
        data = {Path(f).name: (path / f).read_text() for f in gen.get("files", [])}
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    return out


def _matches(obj: dict, target: dict) -> bool:
    unknown = set(target) - {"kind", "name"}
    if unknown:
        raise UnsupportedKustomization(f"patch target by {sorted(unknown)}")
    if "kind" in target and obj["kind"] != target["kind"]:
        return False
    return "name" not in target or re.fullmatch(target["name"], obj["metadata"]["name"]) is not None


def _apply_patch(path: Path, patch: dict, objects: list[dict]) -> None:
    if set(patch) - {"path", "target"} or "path" not in patch or "target" not in patch:
        raise UnsupportedKustomization(f"patch {patch}: only JSON 6902 files with a target")
    ops = yaml.safe_load((path / patch["path"]).read_text())
    if not isinstance(ops, list):
        raise UnsupportedKustomization(f"{patch['path']}: not a JSON 6902 operation list (strategic merge?)")
    hits = [o for o in objects if _matches(o, patch["target"])]
    if not hits:
        raise PatchError(f"patch {patch['path']}: no object matches {patch['target']}")
    for obj in hits:
        for op in ops:
            json_patch(obj, op)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: dict, op: dict) -> None:
    """Apply one RFC 6902 operation (add, replace, remove) in place."""
    *parents, last = _pointer(op["path"])
    node: Any = doc  # a dict or a list, as the path goes down
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.get(key)
        if node is None:
            raise PatchError(f"{op['path']}: {key!r} does not exist")
    kind = op["op"]
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(index, copy.deepcopy(op["value"]))
        elif kind == "replace":
            node[index] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del node[index]
        else:
            raise UnsupportedKustomization(f"JSON 6902 op {kind!r}")
        return
    if kind in ("replace", "remove") and last not in node:
        raise PatchError(f"{op['path']}: nothing to {kind}")
    if kind in ("add", "replace"):
        node[last] = copy.deepcopy(op["value"])
    elif kind == "remove":
        del node[last]
    else:
        raise UnsupportedKustomization(f"JSON 6902 op {kind!r}")


def _containers(obj: dict):
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec if obj["kind"] == "Pod" else {})
    for key in ("initContainers", "containers"):
        yield from pod.get(key, [])


def _set_image(objects: list[dict], image: dict) -> None:
    unknown = set(image) - {"name", "newName", "newTag"}
    if unknown:
        raise UnsupportedKustomization(f"images: {sorted(unknown)}")
    for obj in objects:
        for c in _containers(obj):
            name, _, tag = c["image"].partition(":")
            if name == image["name"]:
                c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}" \
                    if image.get("newTag", tag) else image.get("newName", name)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    objects = render(Path(argv[0])) if "--python" in argv[1:] or kustomize_binary() is None \
        else render_with_binary(Path(argv[0]))
    yaml.safe_dump_all(objects, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
