"""The Kubernetes manifests under deploy/: YAML that parses, the fields KubeRay needs, and an app that builds.

No cluster here: the RayService is checked against the parts of KubeRay's CRD (ray.io/v1) it uses
(a hand-written schema: required keys and their types), its ``serveConfigV2`` must be valid Serve
config YAML whose ``import_path`` names our builder, and with Ray installed the builder must accept
the manifest's ``args`` (the same validation a replica start would do). The GPU bookkeeping must
agree: one GPU per engine replica, one replica per GPU worker pod.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
RAYSERVICE = ROOT / "deploy" / "kuberay" / "rayservice.yaml"

# key: (type, required) for the parts of the RayService CRD this manifest uses.
SCHEMA = {
    "apiVersion": (str, True), "kind": (str, True), "metadata": (dict, True), "spec": (dict, True),
    "spec.serveConfigV2": (str, True), "spec.rayClusterConfig": (dict, True),
    "spec.rayClusterConfig.rayVersion": (str, True), "spec.rayClusterConfig.headGroupSpec": (dict, True),
    "spec.rayClusterConfig.headGroupSpec.rayStartParams": (dict, True),
    "spec.rayClusterConfig.headGroupSpec.template.spec.containers": (list, True),
    "spec.rayClusterConfig.workerGroupSpecs": (list, True),
    "spec.serviceUnhealthySecondThreshold": (int, False), "spec.deploymentUnhealthySecondThreshold": (int, False),
}
WORKER_SCHEMA = {"groupName": (str, True), "replicas": (int, True), "minReplicas": (int, False),
                 "maxReplicas": (int, False), "rayStartParams": (dict, True), "template.spec.containers": (list, True)}


def _get(doc: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return KeyError
        doc = doc[part]
    return doc


def _check(doc: dict, schema: dict, where: str) -> None:
    for key, (kind, required) in schema.items():
        value = _get(doc, key)
        if value is KeyError:
            assert not required, f"{where}: {key} is missing"
            continue
        assert isinstance(value, kind), f"{where}: {key} should be {kind.__name__}, is {type(value).__name__}"


def _string_map(params: dict, where: str) -> None:
    for k, v in params.items():   # KubeRay passes rayStartParams as `--key=value`: strings only
        assert isinstance(v, str), f"{where}: rayStartParams.{k} must be a string (quote it), got {v!r}"


def test_rayservice_manifest_structure():
    docs = list(yaml.safe_load_all(RAYSERVICE.read_text()))
    assert len(docs) == 1
    doc = docs[0]
    _check(doc, SCHEMA, "RayService")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayService"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    cluster = doc["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    _string_map(head["rayStartParams"], "head")
    assert head["rayStartParams"].get("num-cpus") == "0", "no engine replica may land on the head"
    for i, group in enumerate(cluster["workerGroupSpecs"]):
        _check(group, WORKER_SCHEMA, f"workerGroupSpecs[{i}]")
        _string_map(group["rayStartParams"], f"workerGroupSpecs[{i}]")
        for c in group["template"]["spec"]["containers"]:
            assert c["image"] and c["name"]
    # rayVersion matches what the `ray` extra installs (its lower bound).
    pyproject = (ROOT / "pyproject.toml").read_text()
    bound = re.search(r'ray = \["ray\[serve\]>=([0-9.]+)"\]', pyproject).group(1)
    assert cluster["rayVersion"].startswith(bound), (cluster["rayVersion"], bound)


def test_rayservice_serve_config_and_gpu_bookkeeping():
    doc = yaml.safe_load(RAYSERVICE.read_text())
    serve_cfg = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert serve_cfg["http_options"]["port"] == 8000
    (app,) = serve_cfg["applications"]
    module, _, attr = app["import_path"].partition(":")
    assert module == "recguide_trt.serving.ray_app" and attr == "build_from_args"
    args = app["args"]
    (group,) = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    container = group["template"]["spec"]["containers"][0]
    gpus_per_pod = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus_per_pod == int(group["rayStartParams"]["num-gpus"]) == args["replica_gpus"] == 1
    assert float(args["replica_cpus"]) <= float(group["rayStartParams"]["num-cpus"])
    assert group["replicas"] >= args["replicas"] and group["maxReplicas"] >= args["max_replicas"]
    assert group.get("minReplicas", 0) <= args["min_replicas"] <= args["replicas"] <= args["max_replicas"]
    assert args["device"] == "cuda" and args["backend"] in ("tensorrt", "torch")


def test_rayservice_args_build_the_application():
    pytest.importorskip("ray.serve")
    doc = yaml.safe_load(RAYSERVICE.read_text())
    app = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"][0]
    module, _, attr = app["import_path"].partition(":")
    builder = getattr(importlib.import_module(module), attr)
    from ray.serve import Application

    assert isinstance(builder(app["args"]), Application)
    with pytest.raises(ValueError, match="unknown recguide application args"):
        builder({**app["args"], "replica": 2})
