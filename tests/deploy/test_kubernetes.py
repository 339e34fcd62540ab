"""The Kubernetes manifests (deploy/kubernetes/) hold to KubeRay's published schema, to Ray's and to ours: each
validates against KubeRay v1.7's CRD (tests/data/kuberay/, unknown fields refused as `kubectl apply
--validate=strict` does), the RayService's serveConfigV2 parses with Ray's own ServeDeploySchema and its args with
AppConfig, and it is byte for byte what `rayscore config` prints for the flags its containers run with; the
Dockerfile's Ray and Python versions are pyproject.toml's."""

from __future__ import annotations

import functools
import gzip
import re
import shlex
import sys
from copy import deepcopy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tomllib
import yaml
from packaging.specifiers import SpecifierSet
from ray.serve.schema import ServeDeploySchema

from deploy.cli import build
from deploy.config import AppConfig
from deploy.serve_config import dump

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
CRDS = ROOT / "tests" / "data" / "kuberay"


def strict(schema: Any) -> Any:
    """A CRD schema that refuses what Kubernetes' strict field validation refuses: a property the schema does not
    name, where the object's fields are listed and unknown ones are not preserved on purpose."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    return schema


@functools.cache
def crd(plural: str) -> jsonschema.protocols.Validator:
    """A validator of the CRD's v1 schema (OpenAPI v3's subset of JSON Schema: draft 4 keywords, read as draft 7)."""
    loaded = yaml.load(gzip.decompress((CRDS / f"ray.io_{plural}.yaml.gz").read_bytes()), Loader=yaml.CSafeLoader)
    (version,) = [v for v in loaded["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]))


def manifest(name: str) -> dict[str, Any]:
    return yaml.safe_load((K8S / name).read_text())


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


@pytest.mark.parametrize(("name", "plural"), [("rayservice.yaml", "rayservices"), ("rayjob.yaml", "rayjobs")])
def test_manifest_validates_against_kuberays_crd(name: str, plural: str) -> None:
    doc = manifest(name)
    crd(plural).validate(doc)  # raises, naming the path, on a wrong type or an unknown field


def test_strict_schema_refuses_an_unknown_field() -> None:
    """The check above can fail: a misspelt field of the RayService is refused."""
    doc = deepcopy(manifest("rayservice.yaml"))
    doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplica"] = 8
    with pytest.raises(jsonschema.ValidationError, match="maxReplica"):
        crd("rayservices").validate(doc)


def test_serve_config_v2_is_what_rayscore_config_prints() -> None:
    spec = manifest("rayservice.yaml")["spec"]
    flags = {next(e["value"] for e in c["env"] if e["name"] == "RAYSCORE_FLAGS")
             for c in containers(spec["rayClusterConfig"])}
    assert len(flags) == 1, f"the containers start with different flags: {flags}"
    (text,) = flags
    config, _ = build(shlex.split(text), "rayscore config")
    assert spec["serveConfigV2"] == dump(config), "paste `rayscore config $RAYSCORE_FLAGS` into serveConfigV2"
    for c in containers(spec["rayClusterConfig"]):  # every node sets up its front door from those flags, then starts
        script = c["args"][0]
        assert "rayscore config $RAYSCORE_FLAGS" in script and "--print-env" in script
        assert script.rstrip().endswith("$KUBERAY_GEN_RAY_START_CMD")


def test_serve_config_v2_parses_with_rays_schema_and_ours() -> None:
    config = yaml.safe_load(manifest("rayservice.yaml")["spec"]["serveConfigV2"])
    schema = ServeDeploySchema.model_validate(config)
    (app,) = schema.applications
    assert app.import_path == "deploy.app:build_app"
    cfg = AppConfig.model_validate(app.args)
    assert cfg.worker_num_gpus == 1 and cfg.worker_autoscaling is not None
    # The cluster's autoscaling bounds are the app's: Ray adds a GPU pod per worker replica Serve asks for.
    group = manifest("rayservice.yaml")["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert group["maxReplicas"] == cfg.worker_autoscaling["max_replicas"]
    gpus = int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus == cfg.worker_num_gpus * cfg.tensor_parallel_size


def test_rayjob_entrypoint_makes_a_config_rayscore_batch_reads() -> None:
    entry = manifest("rayjob.yaml")["spec"]["entrypoint"]
    found = re.match(r"rayscore config (.+?) > (\S+) && rayscore batch (.+)$", entry)
    assert found, entry
    config, _ = build(shlex.split(found.group(1)), "rayscore config")
    ServeDeploySchema.model_validate(config)
    assert f"--config {found.group(2)}" in found.group(3)
    from offline.cli import _parser

    _parser().parse_args(shlex.split(found.group(3)))  # the batch tool takes its arguments


def test_dockerfile_versions_are_pyprojects() -> None:
    text = (K8S / "Dockerfile").read_text()
    ray = re.search(r"^ARG RAY_VERSION=(\S+)$", text, re.M).group(1)
    tag = re.search(r"^ARG PYTHON_TAG=py(\d)(\d+)$", text, re.M)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [d.split("]", 1)[1] for d in project["dependencies"] if d.startswith("ray[serve]")]
    floor = re.match(r">=\s*([\d.]+)", spec).group(1)
    assert ray in SpecifierSet(spec) and (ray == floor or ray.startswith(floor + ".")), (ray, spec)
    python = f"{tag.group(1)}.{tag.group(2)}"
    assert python in SpecifierSet(project["requires-python"]), (python, project["requires-python"])
    assert (int(tag.group(1)), int(tag.group(2))) == sys.version_info[:2], "the image's Python is the one tested"
    for doc in ("rayservice.yaml", "rayjob.yaml"):
        spec_ = manifest(doc)["spec"]
        assert (spec_.get("rayClusterConfig") or spec_["rayClusterSpec"])["rayVersion"] == ray
