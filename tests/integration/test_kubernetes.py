"""deploy/kubernetes/: the kustomize manifests, checked offline.

No cluster runs here. Each kustomization is rendered in Python (:func:`render`: resources,
configMapGenerator, secretGenerator, inline JSON 6902 patches, images and namespace, the parts
these kustomizations and the overlay in docs/kubernetes.md use; any other field is refused, not
ignored), and where ``kubectl`` is installed its own kustomize renders each one too and must give
the same objects. Every core object is validated against the Kubernetes API's OpenAPI schemas
that the kubernetes-validate package ships (offline; strict: an unknown field is an error), for
the oldest Kubernetes the manifests support and the newest the package knows. KEDA's objects
are checked against the fields KEDA documents.

What no schema knows is checked against the package: the queues each scaler watches are the
queues its workers consume (``worker.backend.queues``, ``worker.runtime.supervisor``), every
variable and setting the pods get is one the service reads (``worker.config``), the probes run
the image's commands for the pod's own Celery node, the security context is the Dockerfile's
user. Two tests use real parts: a real Redis (the list each redis trigger counts is where the
tasks of its queue wait; and RabbitMQ's queues where it runs) and real Celery workers started
with the manifests' commands (their probes answer, and fail once the worker is gone).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate.utils as kubernetes_schemas
import pytest
import redis
import yaml
from support.docs_runner import blocks
from test_deployment import COMPOSE, DOCKERFILE, StrictLoader, dockerfile_stages, stage_env

from worker.backend.queues import (
    COMPACT_TASK,
    EVALUATE_QUEUE,
    EVALUATE_TASK,
    IDLE_COMPACT_TASK,
    IDLE_SCAN_TASK,
    MAINTENANCE_QUEUE,
    PRUNE_TASK,
    QUEUES,
    RECONCILE_TASK,
    SUMMARIZE_QUEUE,
    SUMMARIZE_TASK,
    TaskSender,
    broker_url,
    queue_lengths,
)
from worker.cli import build_parser
from worker.config import (
    OTHER_VARIABLES,
    Settings,
    env_names,
    load_settings,
    settings_from_mapping,
    unknown_variables,
    with_broker_url,
    with_redis_url,
)
from worker.runtime.celery_app import make_app
from worker.runtime.supervisor import UP_WORKERS, celery_command

REPO = Path(__file__).resolve().parent.parent.parent
MANIFESTS = REPO / "deploy" / "kubernetes"
BASE = MANIFESTS / "base"
TRIAL = MANIFESTS
KEDA_REDIS = MANIFESTS / "keda" / "redis"
KEDA_RABBITMQ = MANIFESTS / "keda" / "rabbitmq"
SHIPPED_CONFIG = REPO / "config" / "compactor.toml"
CONFIG_COPY = BASE / "compactor.toml"
DOCS_PAGE = REPO / "docs" / "kubernetes.md"
OUR_IMAGE = "compaction-worker"

# The oldest Kubernetes the manifests are for (every field they use exists there), and the
# newest whose schemas the installed kubernetes-validate ships.
OLDEST_KUBERNETES = "1.29"
KUBERNETES_VERSIONS = [OLDEST_KUBERNETES, kubernetes_schemas.latest_version()]


# --- reading the manifests -----------------------------------------------------------------


def load_documents(text: str) -> list[dict[str, Any]]:
    """Every document of a YAML stream, refusing a duplicate key (which PyYAML would silently
    resolve to the last, where kubectl refuses the file)."""
    return [doc for doc in yaml.load_all(text, Loader=StrictLoader) if doc is not None]


def load_one(path: Path) -> dict[str, Any]:
    (doc,) = load_documents(path.read_text(encoding="utf-8"))
    return doc


# --- rendering a kustomization, the parts these use ----------------------------------------

KUSTOMIZATION_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "configMapGenerator",
    "secretGenerator",
    "patches",
    "images",
    "namespace",
}


@dataclass
class Rendered:
    objects: list[dict[str, Any]]
    # Generated objects whose name kustomize suffixes with a hash of their content (this
    # renderer keeps the plain name; references to them are plain too).
    hashed: set[str]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        return found

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]


def render(directory: Path) -> Rendered:
    """The objects ``kubectl kustomize directory`` gives, generated names unsuffixed."""
    spec = load_one(directory / "kustomization.yaml")
    assert spec["apiVersion"] == "kustomize.config.k8s.io/v1beta1", directory
    assert spec["kind"] == "Kustomization", directory
    unknown = set(spec) - KUSTOMIZATION_FIELDS
    assert not unknown, f"{directory}: a kustomize field this renderer does not know: {unknown}"
    out = Rendered([], set())
    for entry in spec.get("resources", []):
        path = directory / entry
        if path.is_dir():
            inner = render(path)
            out.objects += inner.objects
            out.hashed |= inner.hashed
        else:
            out.objects += load_documents(path.read_text(encoding="utf-8"))
    for generator in spec.get("configMapGenerator", []):
        generate(out, "ConfigMap", generator, generated_data(directory, generator))
    for generator in spec.get("secretGenerator", []):
        data = {
            key: base64.b64encode(value.encode()).decode()
            for key, value in generated_data(directory, generator).items()
        }
        generate(out, "Secret", generator, data)
    for patch in spec.get("patches", []):
        apply_patch(out.objects, patch)
    for image in spec.get("images", []):
        set_image(out.objects, image)
    if "namespace" in spec:
        for obj in out.objects:
            obj["metadata"]["namespace"] = spec["namespace"]
    return out


def generated_data(directory: Path, generator: dict[str, Any]) -> dict[str, str]:
    assert set(generator) <= {"name", "behavior", "files", "literals", "options"}, generator
    data = {}
    for entry in generator.get("files", []):
        key, _, path = entry.rpartition("=")
        data[key or Path(path).name] = (directory / path).read_text(encoding="utf-8")
    for entry in generator.get("literals", []):
        key, _, value = entry.partition("=")
        data[key] = value
    return data


def generate(out: Rendered, kind: str, generator: dict[str, Any], data: dict[str, str]) -> None:
    name, behavior = generator["name"], generator.get("behavior", "create")
    existing = [o for o in out.objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if behavior == "create":
        assert not existing, f"{kind} {name} generated twice"
        obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}
        obj["data"] = data
        if kind == "Secret":
            obj["type"] = "Opaque"
        out.objects.append(obj)
    else:
        (obj,) = existing
        obj["data"] = data if behavior == "replace" else {**obj["data"], **data}
    if not generator.get("options", {}).get("disableNameSuffixHash", False):
        out.hashed.add(name)


def apply_patch(objects: list[dict[str, Any]], patch: dict[str, Any]) -> None:
    """An inline JSON 6902 patch (add, replace, remove) on the objects its target names."""
    target = patch["target"]
    assert set(target) <= {"kind", "name"} and isinstance(patch["patch"], str), patch
    matched = [
        o
        for o in objects
        if o["kind"] == target["kind"] and o["metadata"]["name"] == target.get("name")
    ]
    assert matched, f"the patch's target matches nothing: {target}"
    ops = yaml.safe_load(patch["patch"])
    assert isinstance(ops, list), "a JSON 6902 patch (a strategic merge one is not rendered here)"
    for obj in matched:
        for op in ops:
            *parents, last = [
                p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
            ]
            node = obj
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
            if op["op"] == "remove":
                del node[int(last) if isinstance(node, list) else last]
            elif op["op"] == "add" and isinstance(node, list):
                node.insert(len(node) if last == "-" else int(last), op["value"])
            else:
                assert op["op"] in ("add", "replace"), op
                assert op["op"] == "add" or last in node, f"nothing to replace at {op['path']}"
                node[last] = op["value"]


def set_image(objects: list[dict[str, Any]], image: dict[str, Any]) -> None:
    for _, container in containers(objects):
        name, _, tag = container["image"].rpartition(":")
        if name == image["name"]:
            container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(Deployment, container) for every container of every Deployment."""
    for obj in objects:
        if obj["kind"] == "Deployment":
            for container in obj["spec"]["template"]["spec"]["containers"]:
                yield obj, container


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def ours(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(Deployment, container) for every container that runs this project's image."""
    for deployment, container in containers(objects):
        if container["image"].rpartition(":")[0].endswith(OUR_IMAGE):
            yield deployment, container


# --- the kustomizations ----------------------------------------------------------------------


def docs_text_blocks() -> list[str]:
    return [b.text for b in blocks(DOCS_PAGE) if b.lang == "text"]


def docs_overlay(tmp_path: Path) -> Path:
    """docs/kubernetes.md's production overlay, laid out as the page says: beside a checkout
    of this repository, with the page's compactor.toml."""
    (tmp_path / "compaction-worker").symlink_to(REPO)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (text,) = [t for t in docs_text_blocks() if "kind: Kustomization" in t]
    (overlay / "kustomization.yaml").write_text(text)
    (toml,) = [b.text for b in blocks(DOCS_PAGE) if b.lang == "toml"]
    (overlay / "compactor.toml").write_text(toml)
    return overlay


def with_rabbitmq(tmp_path: Path) -> Path:
    """The base with the RabbitMQ scalers (and the trial's Redis for the state)."""
    overlay = tmp_path / "rabbitmq"
    overlay.mkdir()
    resources = [os.path.relpath(d, overlay) for d in (BASE, MANIFESTS / "redis", KEDA_RABBITMQ)]
    spec = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": resources,
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    return overlay


KUSTOMIZATIONS = {
    "trial": lambda tmp: TRIAL,
    "base": lambda tmp: BASE,
    "base+keda/rabbitmq": with_rabbitmq,
    "docs overlay": docs_overlay,
}


@pytest.fixture(params=list(KUSTOMIZATIONS))
def kustomization(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return KUSTOMIZATIONS[request.param](tmp_path)


@pytest.fixture(scope="module")
def trial() -> Rendered:
    return render(TRIAL)


@pytest.fixture(scope="module")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return render(with_rabbitmq(tmp_path_factory.mktemp("rabbitmq")))


# --- rendering: this renderer and kustomize agree ---------------------------------------------


def kustomize_available() -> bool:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return False
    probe = subprocess.run([kubectl, "kustomize", "--help"], capture_output=True, timeout=60)
    return probe.returncode == 0


def test_kustomize_renders_what_this_renderer_renders(
    kustomization: Path, subprocesses: None
) -> None:
    if not kustomize_available():
        pytest.skip("no kubectl with kustomize here: the manifests are rendered in Python only")
    ours_ = render(kustomization)
    done = subprocess.run(
        ["kubectl", "kustomize", str(kustomization)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for name in ours_.hashed:  # kustomize's suffix: a hash of the content
        text, count = re.subn(rf"\b{re.escape(name)}-[a-z0-9]{{10}}\b", name, text)
        assert count, f"kustomize did not suffix {name}"

    def key(o: dict[str, Any]) -> tuple[str, str]:
        return o["kind"], o["metadata"]["name"]

    theirs = sorted(load_documents(text), key=key)
    assert sorted(ours_.objects, key=key) == theirs


def test_the_renderer_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    spec = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({**spec, "replicas": []}))
    with pytest.raises(AssertionError, match="replicas"):
        render(tmp_path)


# --- the Kubernetes schemas ------------------------------------------------------------------


def schema_errors(obj: dict[str, Any], version: str) -> list[str]:
    try:
        kubernetes_schemas.validate(obj, version, strict=True)
    except kubernetes_schemas.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


def core(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if not o["apiVersion"].startswith("keda.sh/")]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_core_object_validates_against_the_kubernetes_schemas(
    kustomization: Path, version: str
) -> None:
    objects = core(render(kustomization).objects)
    assert objects
    errors = {
        f"{o['kind']}/{o['metadata']['name']}": found
        for o in objects
        if (found := schema_errors(o, version))
    }
    assert errors == {}


def test_the_schema_check_rejects_a_broken_copy(trial: Rendered) -> None:
    """Strict validation catches what the API server would refuse: a misspelled field, a value
    of the wrong type."""
    deployment = copy.deepcopy(trial.named("Deployment", "compaction-worker-beat"))
    assert schema_errors(deployment, OLDEST_KUBERNETES) == []
    deployment["spec"]["template"]["spec"]["containers"][0]["comand"] = ["compactor"]
    assert "'comand' was unexpected" in schema_errors(deployment, OLDEST_KUBERNETES)[0]
    budget = copy.deepcopy(trial.named("PodDisruptionBudget", "compaction-worker-serve"))
    budget["spec"]["minAvailable"] = [1]
    assert schema_errors(budget, OLDEST_KUBERNETES)


def test_the_schemas_of_the_oldest_kubernetes_supported_are_there() -> None:
    shipped = {version.rsplit(".", 1)[0] for version in kubernetes_schemas.all_versions()}
    assert OLDEST_KUBERNETES in shipped


# --- KEDA: the fields it documents ----------------------------------------------------------

# From KEDA's documentation (keda.sh/docs/2.16-2.18): reference/scaledobject-spec,
# scalers/redis-lists ("Redis Lists Or Strings"), scalers/rabbitmq-queue, concepts/authentication.
SCALED_OBJECT_SPEC = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
SCALE_TARGET_REF = {"apiVersion", "kind", "name", "envSourceContainerName"}
ADVANCED = {"restoreToOriginalReplicaCount", "horizontalPodAutoscalerConfig", "scalingModifiers"}
HPA_CONFIG = {"name", "behavior"}
TRIGGER = {"type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"}
TRIGGER_METADATA = {
    "redis": {
        "address",
        "host",
        "port",
        "usernameFromEnv",
        "passwordFromEnv",
        "listName",
        "listLength",
        "activationListLength",
        "keyName",
        "keyValue",
        "activationValue",
        "enableTLS",
        "unsafeSsl",
        "databaseIndex",
        "addressFromEnv",
        "hostFromEnv",
        "portFromEnv",
    },
    "rabbitmq": {
        "host",
        "protocol",
        "mode",
        "value",
        "activationValue",
        "queueName",
        "vhostName",
        "hostFromEnv",
        "usernameFromEnv",
        "passwordFromEnv",
        "unsafeSsl",
        "timeout",
        "useRegex",
        "pageSize",
        "operation",
        "excludeUnacknowledged",
    },
}
# The trigger's metadata that names its queue, and where the address may come from.
QUEUE_FIELD = {"redis": "listName", "rabbitmq": "queueName"}
ADDRESS_SOURCES = {
    "redis": {"address", "host", "addressFromEnv", "hostFromEnv"},
    "rabbitmq": {"host", "hostFromEnv"},
}
AUTHENTICATION_PARAMETERS = {
    "redis": {"address", "host", "port", "username", "password", "tls", "ca", "cert", "key"}
    | {"keyPassword"},
    "rabbitmq": {"host", "username", "password", "vhostName", "tls", "ca", "cert", "key"},
}
RABBITMQ_MODES = {"QueueLength", "MessageRate", "DeliverGetRate"}
KEDA_API = "keda.sh/v1alpha1"


def keda_problems(rendered: Rendered) -> list[str]:
    """What KEDA would refuse or misread in the rendered objects (empty: nothing)."""
    problems = []
    auths = {o["metadata"]["name"]: o for o in rendered.of_kind("TriggerAuthentication")}
    for auth in auths.values():
        assert auth["apiVersion"] == KEDA_API
        assert set(auth["spec"]) == {"secretTargetRef"}, auth["spec"]
        for ref in auth["spec"]["secretTargetRef"]:
            if set(ref) != {"parameter", "name", "key"}:
                problems.append(f"{auth['metadata']['name']}: secretTargetRef entry {ref}")
    for scaled in rendered.of_kind("ScaledObject"):
        name, spec = scaled["metadata"]["name"], scaled["spec"]
        if scaled["apiVersion"] != KEDA_API:
            problems.append(f"{name}: apiVersion {scaled['apiVersion']}")
        problems += [f"{name}: undocumented spec.{k}" for k in set(spec) - SCALED_OBJECT_SPEC]
        target = spec["scaleTargetRef"]
        problems += [
            f"{name}: undocumented scaleTargetRef.{k}" for k in target.keys() - SCALE_TARGET_REF
        ]
        advanced = spec.get("advanced", {})
        problems += [f"{name}: undocumented advanced.{k}" for k in advanced.keys() - ADVANCED]
        hpa = advanced.get("horizontalPodAutoscalerConfig", {})
        problems += [f"{name}: undocumented hpa config {k}" for k in hpa.keys() - HPA_CONFIG]
        if not 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]:
            problems.append(f"{name}: replicas {spec['minReplicaCount']}-{spec['maxReplicaCount']}")
        for trigger in spec["triggers"]:
            problems += trigger_problems(name, trigger, auths)
    return problems


def trigger_problems(
    scaled: str, trigger: dict[str, Any], auths: dict[str, dict[str, Any]]
) -> list[str]:
    kind, metadata = trigger["type"], trigger["metadata"]
    where = f"{scaled} trigger {trigger.get('name', kind)}"
    if kind not in TRIGGER_METADATA:
        return [f"{where}: type {kind}"]
    problems = [f"{where}: undocumented {k}" for k in trigger.keys() - TRIGGER]
    problems += [
        f"{where}: undocumented metadata {k}" for k in metadata.keys() - TRIGGER_METADATA[kind]
    ]
    # KEDA's metadata is a map of strings: YAML's 20 or true would be refused.
    problems += [
        f"{where}: {k} is not a string" for k, v in metadata.items() if not isinstance(v, str)
    ]
    auth_params: set[str] = set()
    if "authenticationRef" in trigger:
        auth = auths.get(trigger["authenticationRef"]["name"])
        if auth is None:
            return [*problems, f"{where}: no TriggerAuthentication {trigger['authenticationRef']}"]
        auth_params = {ref["parameter"] for ref in auth["spec"]["secretTargetRef"]}
        documented = AUTHENTICATION_PARAMETERS[kind]
        problems += [f"{where}: undocumented auth parameter {p}" for p in auth_params - documented]
    if not (metadata.keys() | auth_params) & ADDRESS_SOURCES[kind]:
        problems.append(f"{where}: no address")
    if QUEUE_FIELD[kind] not in metadata:
        problems.append(f"{where}: no {QUEUE_FIELD[kind]}")
    target = metadata.get("listLength") if kind == "redis" else metadata.get("value")
    if not (isinstance(target, str) and target.isdigit() and int(target) >= 1):
        problems.append(f"{where}: target per replica {target!r}")
    if kind == "rabbitmq" and metadata.get("mode") not in RABBITMQ_MODES:
        problems.append(f"{where}: mode {metadata.get('mode')!r}")
    return problems


def test_keda_objects_carry_the_fields_keda_documents(trial: Rendered, rabbitmq: Rendered) -> None:
    for rendered in (trial, rabbitmq):
        assert rendered.of_kind("ScaledObject")
        assert keda_problems(rendered) == []


def test_the_keda_check_reports_what_keda_would_refuse(trial: Rendered) -> None:
    broken = copy.deepcopy(trial)
    scaled = broken.named("ScaledObject", "compaction-worker-summarize")
    scaled["spec"]["maxReplicas"] = 3  # the HPA's name, not KEDA's
    trigger = scaled["spec"]["triggers"][0]
    trigger["metadata"]["listLength"] = 8
    trigger["metadata"]["queueName"] = SUMMARIZE_QUEUE  # rabbitmq's field on a redis trigger
    problems = keda_problems(broken)
    for expected in ("spec.maxReplicas", "listLength is not a string", "metadata queueName"):
        assert any(expected in p for p in problems), (expected, problems)


def test_every_hpa_behaviour_is_one_kubernetes_accepts(trial: Rendered, rabbitmq: Rendered) -> None:
    """KEDA hands ``advanced.horizontalPodAutoscalerConfig.behavior`` to the HPA as it is."""
    for rendered in (trial, rabbitmq):
        for scaled in rendered.of_kind("ScaledObject"):
            spec = scaled["spec"]
            hpa = {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": scaled["metadata"]["name"]},
                "spec": {
                    "scaleTargetRef": {
                        "kind": "Deployment",
                        "name": spec["scaleTargetRef"]["name"],
                    },
                    "minReplicas": spec["minReplicaCount"],
                    "maxReplicas": spec["maxReplicaCount"],
                    "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
                },
            }
            for version in KUBERNETES_VERSIONS:
                assert schema_errors(hpa, version) == []


# --- the queues: scalers watch what the workers consume ---------------------------------------


def consumed_queues(deployment: dict[str, Any]) -> set[str]:
    """The queues the Deployment's workers consume, as its command asks the package's CLI."""
    argv = pod_spec(deployment)["containers"][0].get("command", [])
    if argv[:2] != ["compactor", "worker"]:
        return set()
    args = build_parser().parse_args(argv[1:])
    queues = celery_command("worker", None, queues=args.queues, pool=args.pool, name=args.name)
    return set(queues[queues.index("-Q") + 1].split(","))


def watched_queues(scaled: dict[str, Any]) -> set[str]:
    return {t["metadata"][QUEUE_FIELD[t["type"]]] for t in scaled["spec"]["triggers"]}


def scaler_problems(rendered: Rendered) -> list[str]:
    """Scalers and workers that disagree about queues (empty: none)."""
    deployments = {d["metadata"]["name"]: d for d in rendered.of_kind("Deployment")}
    consumers = {name: consumed_queues(d) for name, d in deployments.items()}
    consumed_anywhere = set().union(*consumers.values())
    problems = []
    scaled_targets = []
    for scaled in rendered.of_kind("ScaledObject"):
        name, target = scaled["metadata"]["name"], scaled["spec"]["scaleTargetRef"]
        scaled_targets.append(target["name"])
        if target.get("kind", "Deployment") != "Deployment" or target["name"] not in deployments:
            problems.append(f"{name} scales {target}, which is no Deployment here")
            continue
        consumed, watched = consumers[target["name"]], watched_queues(scaled)
        for queue in sorted(watched - consumed_anywhere):
            problems.append(f"{name} watches {queue}, which no worker consumes")
        for queue in sorted((watched & consumed_anywhere) - consumed):
            problems.append(f"{name} watches {queue}, which {target['name']} does not consume")
        for queue in sorted(consumed - watched):
            problems.append(f"{target['name']} consumes {queue}, which {name} does not watch")
    workers = [name for name, queues in consumers.items() if queues]
    if sorted(scaled_targets) != sorted(workers):
        problems.append(f"one scaler per worker Deployment: {scaled_targets} for {workers}")
    return problems


def test_the_scalers_watch_exactly_the_queues_their_workers_consume(
    trial: Rendered, rabbitmq: Rendered
) -> None:
    for rendered in (trial, rabbitmq):
        assert scaler_problems(rendered) == []
        watched = set().union(*map(watched_queues, rendered.of_kind("ScaledObject")))
        assert watched == set(QUEUES), "every queue of the package is watched"


@pytest.mark.parametrize(
    ("listed", "problem"),
    [
        ("compactor.sumarize", "watches compactor.sumarize, which no worker consumes"),
        (EVALUATE_QUEUE, "compaction-worker-summarize does not consume"),
    ],
)
def test_a_scaler_watching_a_queue_its_workers_do_not_consume_fails(
    trial: Rendered, listed: str, problem: str
) -> None:
    broken = copy.deepcopy(trial)
    scaled = broken.named("ScaledObject", "compaction-worker-summarize")
    scaled["spec"]["triggers"][0]["metadata"]["listName"] = listed
    problems = scaler_problems(broken)
    assert any(problem in p for p in problems), problems
    assert any("consumes compactor.summarize, which" in p for p in problems), problems


def test_the_rabbitmq_scalers_are_the_redis_ones_but_for_their_triggers(
    trial: Rendered, rabbitmq: Rendered
) -> None:
    """The same bounds, pace and target per replica for each queue, whichever the broker."""

    def bounds(scaled: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        spec = copy.deepcopy(scaled["spec"])
        spec["scaleTargetRef"].pop("envSourceContainerName", None)
        per_queue = {
            t["metadata"][QUEUE_FIELD[t["type"]]]: t["metadata"].get("listLength")
            or t["metadata"]["value"]
            for t in spec.pop("triggers")
        }
        return spec, per_queue

    on_redis = {s["metadata"]["name"]: bounds(s) for s in trial.of_kind("ScaledObject")}
    on_rabbitmq = {s["metadata"]["name"]: bounds(s) for s in rabbitmq.of_kind("ScaledObject")}
    assert on_rabbitmq == on_redis


def test_the_pages_numbers_are_the_manifests(trial: Rendered) -> None:
    """docs/kubernetes.md's scaling table, grace periods and oldest Kubernetes."""
    text = DOCS_PAGE.read_text()
    assert f"Kubernetes {OLDEST_KUBERNETES} or newer" in text
    table = text[text.index("| `ScaledObject` |") :].split("\n\n")[0]
    rows = {}
    for line in table.splitlines()[2:]:
        scaled, target, queues, per_replica, replicas = (
            cell.strip() for cell in line.strip("|").split("|")
        )
        queue_names = set(re.findall(r"`([^`]+)`", queues))
        rows[scaled.strip("`")] = (target.split()[0].strip("`"), queue_names, per_replica, replicas)
    expected = {}
    for scaled in trial.of_kind("ScaledObject"):
        spec = scaled["spec"]
        (per_replica,) = {t["metadata"]["listLength"] for t in spec["triggers"]}
        expected[scaled["metadata"]["name"]] = (
            spec["scaleTargetRef"]["name"],
            watched_queues(scaled),
            f"{per_replica} waiting",
            f"{spec['minReplicaCount']}-{spec['maxReplicaCount']}",
        )
    assert rows == expected
    for kind in ("evaluate", "summarize"):
        deployment = trial.named("Deployment", f"compaction-worker-{kind}")
        assert f"{pod_spec(deployment)['terminationGracePeriodSeconds']} s for {kind}" in text
        limit = getattr(load_settings(CONFIG_COPY, environ={}).worker, f"{kind}_time_limit_s")
        assert f"{kind}_time_limit_s` is {limit:g}" in " ".join(text.split())


def test_the_workers_are_the_kinds_compactor_up_runs(trial: Rendered) -> None:
    """Each worker Deployment is one of the package's worker kinds: its queues, its pool, its
    node name (``KIND@%h``, one per pod)."""
    kinds = {kind.name: kind for kind in UP_WORKERS}
    seen = set()
    for deployment, container in ours(trial.objects):
        argv = container["command"]
        if argv[:2] != ["compactor", "worker"]:
            continue
        args = build_parser().parse_args(argv[1:])
        kind = kinds[args.name.removesuffix("@%h")]
        assert args.name == f"{kind.name}@%h"
        assert set(args.queues.split(",")) == set(kind.queues.split(","))
        assert args.pool == kind.pool
        assert deployment["metadata"]["name"] == f"compaction-worker-{kind.name}"
        seen.add(kind.name)
    assert seen == set(kinds)


# --- real parts: where the tasks wait is what the scalers count -------------------------------


def sent_by_every_path(settings: Settings) -> dict[str, int]:
    """One task of each kind sent the way the service sends it (the client's TaskSender for
    an evaluation; the Celery app, routed by its task_routes, for the rest, as the workers and
    beat send them); returns how many each queue should now hold."""
    sender = TaskSender(broker_url(settings))
    app = make_app(settings)
    try:
        sender.send(EVALUATE_TASK, ["c-k8s", time.time()], queue=EVALUATE_QUEUE)
        for task, args in (
            (SUMMARIZE_TASK, ["c-k8s", 1]),
            (COMPACT_TASK, ["c-k8s"]),
            (IDLE_COMPACT_TASK, ["c-k8s"]),
            (PRUNE_TASK, []),
            (RECONCILE_TASK, []),
            (IDLE_SCAN_TASK, []),
        ):
            app.send_task(task, args=args)
    finally:
        sender.close()
        app.close()
    return {EVALUATE_QUEUE: 1, SUMMARIZE_QUEUE: 3, MAINTENANCE_QUEUE: 3}


def test_each_redis_trigger_counts_the_list_its_tasks_wait_in(
    trial: Rendered, redis_url: str
) -> None:
    """KEDA's redis scaler counts LLEN of its listName: with Redis as the broker, that list is
    where every task of the queue waits."""
    settings = with_redis_url(Settings(), redis_url)  # the queues in the state's Redis
    expected = sent_by_every_path(settings)
    client = redis.Redis.from_url(redis_url)
    try:
        counted = {
            t["metadata"]["listName"]: client.llen(t["metadata"]["listName"])
            for scaled in trial.of_kind("ScaledObject")
            for t in scaled["spec"]["triggers"]
        }
    finally:
        client.close()
    assert counted == expected


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_each_rabbitmq_trigger_counts_the_queue_its_tasks_wait_in(
    rabbitmq: Rendered, redis_url: str, broker: str
) -> None:
    """KEDA's rabbitmq scaler over AMQP counts the ready messages of its queueName."""
    settings = with_broker_url(with_redis_url(Settings(), redis_url), broker)
    expected = sent_by_every_path(settings)
    names = [
        t["metadata"]["queueName"]
        for scaled in rabbitmq.of_kind("ScaledObject")
        for t in scaled["spec"]["triggers"]
    ]
    assert queue_lengths(broker, names) == expected


# --- variables and settings -----------------------------------------------------------------


def image_env() -> dict[str, str]:
    return stage_env(dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))[-1])


def secret_values(
    rendered: Rendered, extra: dict[str, dict[str, str]]
) -> dict[str, dict[str, str]]:
    values = {
        s["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in s["data"].items()}
        for s in rendered.of_kind("Secret")
    }
    return {**values, **extra}


def container_env(container: dict[str, Any], secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's variables as the kubelet resolves them; a required Secret key that
    ``secrets`` does not hold fails."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]["secretKeyRef"]
        value = secrets.get(ref["name"], {}).get(ref["key"])
        assert value is not None or ref.get("optional"), f"{var['name']}: no {ref}"
        if value is not None:
            env[var["name"]] = value
    assert not container.get("envFrom"), "every variable is named in the manifest"
    return env


def llm_key_names() -> set[str]:
    """The LLM keys docker-compose.yml passes through by name, the default api_key_env among
    them."""
    service = load_documents(COMPOSE.read_text())[0]["x-compactor"]
    names = {k for k in service["environment"] if k.endswith("_API_KEY")}
    assert Settings().llm.api_key_env in names
    return names


def test_every_variable_the_pods_get_is_one_the_service_reads(
    trial: Rendered, rabbitmq: Rendered
) -> None:
    """A setting's variable, one of the other variables the package reads (the API keys), or an
    LLM key by the names [llm] api_key_env takes; the same LLM keys as docker-compose.yml, for
    the summarize workers only."""
    readable = env_names().keys() | OTHER_VARIABLES.keys() | llm_key_names()
    for rendered in (trial, rabbitmq):
        for deployment, container in ours(rendered.objects):
            names = {var["name"] for var in container.get("env", [])}
            assert names <= readable, names - readable
            assert unknown_variables(dict.fromkeys(names, "")) == []
            llm = names & llm_key_names()
            summarizes = deployment["metadata"]["name"] == "compaction-worker-summarize"
            assert llm == (llm_key_names() if summarizes else set()), deployment["metadata"]
            for var in container["env"]:
                if var["name"] in llm:
                    assert var["valueFrom"]["secretKeyRef"]["key"] == var["name"]


def test_the_pods_resolve_the_default_settings_but_where_the_data_lives(
    trial: Rendered, tmp_path: Path
) -> None:
    """With the configuration file the ConfigMap holds and the trial's Secrets (the API keys
    and the optional ones absent), every pod resolves valid settings: the built-in defaults
    but for the Redis URL and the transcript directory (the image's); with the broker's and
    the transcript store's Secrets, those too."""
    config = tmp_path / "compactor.toml"
    config.write_text(
        trial.named("ConfigMap", "compaction-worker-config")["data"]["compactor.toml"]
    )
    api_keys = {"compaction-worker-api-keys": {"api-keys.json": json.dumps({"k" * 24: "acme"})}}
    optional = {
        "compaction-worker-broker": {"url": "amqp://compactor:secret@rabbitmq:5672/compactor"},
        "compaction-worker-transcripts": {"url": "s3://transcripts/compactor"},
    }
    for extra, changed in (({}, set()), (optional, {"broker.url", "transcripts.url"})):
        secrets = secret_values(trial, {**api_keys, **extra})
        for _, container in ours(trial.objects):
            env = {**image_env(), **container_env(container, secrets)}
            settings = load_settings(config, environ=env)
            assert settings.redis.url is not None
            assert (
                settings.redis.url.get_secret_value() == secrets["compaction-worker-redis"]["url"]
            )
            assert (
                str(settings.compaction.transcript_dir) == image_env()["COMPACTOR_TRANSCRIPT_DIR"]
            )
            resolved = settings.model_dump(exclude={"source"})
            defaults = Settings().model_dump(exclude={"source"})
            for dotted in {"redis.url", "compaction.transcript_dir"} | changed:
                section, field = dotted.split(".")
                del resolved[section][field], defaults[section][field]
            assert resolved == defaults, container["name"]


def test_the_configuration_is_config_compactor_toml(trial: Rendered) -> None:
    """The ConfigMap is generated from a copy of config/compactor.toml (kustomize reads no file
    outside the kustomization): the two stay identical, and it is mounted where the image
    reads its configuration."""
    assert CONFIG_COPY.read_bytes() == SHIPPED_CONFIG.read_bytes(), (
        "deploy/kubernetes/base/compactor.toml differs from config/compactor.toml: copy it again"
    )
    data = trial.named("ConfigMap", "compaction-worker-config")["data"]
    assert list(data) == ["compactor.toml"]
    settings_from_mapping(tomllib.loads(data["compactor.toml"]))
    assert "compaction-worker-config" in trial.hashed, "a changed configuration rolls the pods"
    config_path = PurePosixPath(image_env()["COMPACTOR_CONFIG"])
    for deployment, container in ours(trial.objects):
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
        (name,) = [n for n, v in volumes.items() if "configMap" in v]
        assert volumes[name]["configMap"]["name"] == "compaction-worker-config"
        assert mounts[name]["mountPath"] == str(config_path.parent) and mounts[name]["readOnly"]


# --- Secrets: referred to by name, created by the page's commands -----------------------------


def docs_commands() -> list[list[str]]:
    """The page's kubectl command lines, split as a shell would."""
    lines = [line for text in docs_text_blocks() for line in text.splitlines()]
    return [shlex.split(line, comments=True) for line in lines if line.startswith("kubectl ")]


def docs_secrets() -> dict[str, dict[str, str]]:
    """Secret -> key -> value (a file's name for --from-file) as the page's commands create."""
    secrets: dict[str, dict[str, str]] = {}
    for argv in docs_commands():
        if "secret" not in argv:
            continue
        at = argv.index("secret")
        assert argv[at - 1 : at + 2] == ["create", "secret", "generic"], argv
        keys = secrets.setdefault(argv[at + 2], {})
        for arg in argv[at + 3 :]:
            option, _, value = arg.partition("=")
            if option == "--from-literal":
                key, _, keys[key] = value.partition("=")
            elif option == "--from-file":
                key, _, path = value.rpartition("=")
                keys[key or Path(path).name] = path
    return secrets


def secret_refs(rendered: Rendered) -> set[tuple[str, str, bool]]:
    """(Secret, key, optional) of every reference: the containers' and KEDA's."""
    refs = set()
    for _, container in containers(rendered.objects):
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.add((ref["name"], ref["key"], bool(ref.get("optional"))))
    for auth in rendered.of_kind("TriggerAuthentication"):
        for ref in auth["spec"]["secretTargetRef"]:
            refs.add((ref["name"], ref["key"], False))
    return refs


def test_every_secret_is_referred_to_by_name_and_the_page_creates_it(
    trial: Rendered, rabbitmq: Rendered, tmp_path: Path
) -> None:
    """No Secret value is in the manifests (the trial's Redis address is no credential); every
    Secret key the pods and KEDA read is created by the page's commands or the trial, and every
    optional one is named on the page."""
    assert render(BASE).of_kind("Secret") == []
    (trial_secret,) = trial.of_kind("Secret")
    redis_values = secret_values(trial, {})["compaction-worker-redis"]
    assert redis_values["password"] == "" and "@" not in redis_values["url"]
    created = docs_secrets()
    page = DOCS_PAGE.read_text()
    production = render(docs_overlay(tmp_path))
    for rendered in (trial, rabbitmq, production):
        for name, key, optional in secret_refs(rendered):
            assert f"`{name}`" in page and f"`{key}`" in page, (name, key)
            if not optional:
                assert key in created.get(name, {}) or (
                    rendered is not production and name == trial_secret["metadata"]["name"]
                ), (name, key)
    for text in [p.read_text() for p in MANIFESTS.rglob("*.yaml")]:
        assert not re.search(r"\bsk-[A-Za-z0-9_-]{6,}", text)
        assert not re.search(
            r"(?i)(api[_-]?key|token|secret|password)\s*[:=]\s*['\"]?\w{16,}", text
        )


def test_the_redis_secret_says_one_place_to_the_service_and_to_keda(trial: Rendered) -> None:
    """url is what the pods connect to; address, password and the ScaledObjects' databaseIndex
    are the same place, as KEDA's redis scaler takes it (the trial's and the page's)."""
    databases = {
        t["metadata"]["databaseIndex"]
        for scaled in trial.of_kind("ScaledObject")
        for t in scaled["spec"]["triggers"]
    }
    for values in (
        secret_values(trial, {})["compaction-worker-redis"],
        docs_secrets()["compaction-worker-redis"],
    ):
        url = urlsplit(values["url"])
        assert url.scheme == "redis"
        assert values["address"] == f"{url.hostname}:{url.port}"
        assert values["password"] == (url.password or "")
        assert databases == {url.path.strip("/") or "0"}
    service = trial.named("Service", "compaction-worker-redis")
    url = urlsplit(secret_values(trial, {})["compaction-worker-redis"]["url"])
    assert url.hostname == service["metadata"]["name"]
    assert url.port == service["spec"]["ports"][0]["port"]


def test_the_pages_commands_name_what_the_manifests_hold(trial: Rendered) -> None:
    commands = docs_commands()
    for argv in commands:
        if "-k" in argv:
            target = argv[argv.index("-k") + 1]
            if target != ".":  # the overlay's own directory
                assert (REPO / target / "kustomization.yaml").is_file(), argv
        for arg in argv:
            if arg.startswith(("deployment/", "service/")):
                kind, _, name = arg.partition("/")
                trial.named(kind.capitalize(), name)
    summarize = pod_spec(trial.named("Deployment", "compaction-worker-summarize"))["containers"][0]
    llm_keys = {v["name"] for v in summarize["env"] if v["name"].endswith("_API_KEY")}
    assert docs_secrets()["compaction-worker-llm"].keys() <= llm_keys
    page = DOCS_PAGE.read_text()
    image = summarize["image"]
    assert f"docker build -t {image} ." in page
    compose = load_documents(COMPOSE.read_text())[0]["x-compactor"]
    assert compose["image"] == f"${{COMPACTOR_IMAGE:-{image}}}", "one image name for both"


# --- probes and shutdown ---------------------------------------------------------------------


def worker_node(container: dict[str, Any]) -> str:
    return str(build_parser().parse_args(container["command"][1:]).name)


def ping_argv(probe: dict[str, Any]) -> list[str]:
    """The celery command a worker's exec probe runs (``sh -c 'exec celery ...'``)."""
    shell, flag, script = probe["exec"]["command"]
    assert (shell, flag) == ("sh", "-c")
    argv = shlex.split(script)
    assert argv[0] == "exec" and not re.search(r"[|;&`<>]", script), script
    return argv[1:]


def test_each_worker_probe_pings_its_own_node(trial: Rendered) -> None:
    for _, container in ours(trial.objects):
        if container["command"][:2] != ["compactor", "worker"]:
            continue
        node = worker_node(container).replace("%h", "$HOSTNAME")  # %h: the pod's host name
        for kind in ("startupProbe", "livenessProbe"):
            probe = container[kind]
            argv = ping_argv(probe)
            assert argv[:5] == ["celery", "-A", "worker", "inspect", "ping"], argv
            assert argv[argv.index("--destination") + 1] == node
            assert probe["timeoutSeconds"] > float(argv[argv.index("--timeout") + 1])
        assert "readinessProbe" not in container, "ready once the startup probe answered"


def test_serve_probes_its_health_routes(trial: Rendered) -> None:
    from worker.api.app import create_app

    routes = {getattr(route, "path", None) for route in create_app(Settings()).routes}
    serve = trial.named("Deployment", "compaction-worker-serve")
    (container,) = pod_spec(serve)["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert args.host == "0.0.0.0"
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("http", args.port)
    paths = {
        kind: container[kind]["httpGet"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert {p["port"] for p in paths.values()} == {"http"}
    assert (
        paths["livenessProbe"]["path"] == "/healthz"
        and paths["readinessProbe"]["path"] == "/readyz"
    )
    assert {p["path"] for p in paths.values()} <= routes


def test_beat_probe_watches_the_schedule_file_beat_writes(trial: Rendered) -> None:
    beat = trial.named("Deployment", "compaction-worker-beat")
    (container,) = pod_spec(beat)["containers"]
    # TMPDIR is unset in the image, so beat's schedule is under /tmp, an emptyDir.
    schedule = celery_command("beat", None, workdir=Path("/tmp"))
    schedule_path = schedule[schedule.index("--schedule") + 1]
    for kind in ("startupProbe", "livenessProbe"):
        python, flag, code = container[kind]["exec"]["command"]
        assert (python, flag) == ("python", "-c")
        compile(code, "<beat probe>", "exec")
        assert f"glob.glob('{schedule_path}*')" in code
    assert "TMPDIR" not in image_env()
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(beat)["volumes"]}
    assert "emptyDir" in volumes[mounts[str(Path(schedule_path).parent)]]


def test_shutdown_gives_a_running_task_its_time_limit(trial: Rendered) -> None:
    """SIGTERM is Celery's warm shutdown: the grace period outlasts the longest task of the
    pod's queues, by the settings the pods resolve."""
    settings = load_settings(CONFIG_COPY, environ={})
    limits = {
        EVALUATE_QUEUE: settings.worker.evaluate_time_limit_s,
        MAINTENANCE_QUEUE: settings.worker.evaluate_time_limit_s,
        SUMMARIZE_QUEUE: settings.worker.summarize_time_limit_s,
    }
    for deployment in trial.of_kind("Deployment"):
        queues = consumed_queues(deployment)
        if queues:
            longest = max(limits[q] for q in queues)
            assert pod_spec(deployment)["terminationGracePeriodSeconds"] > longest


def test_exactly_one_scheduler_never_two_during_a_rollout(trial: Rendered) -> None:
    def runs_beat(container: dict[str, Any]) -> bool:
        argv = container.get("command", []) + container.get("args", [])
        return argv[:2] == ["compactor", "beat"] or "-B" in argv or "--beat" in argv

    schedulers = [d["metadata"]["name"] for d, c in containers(trial.objects) if runs_beat(c)]
    assert schedulers == ["compaction-worker-beat"]
    beat = trial.named("Deployment", "compaction-worker-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    targets = {s["spec"]["scaleTargetRef"]["name"] for s in trial.of_kind("ScaledObject")}
    assert "compaction-worker-beat" not in targets


def test_scaled_deployments_leave_replicas_to_the_autoscaler(trial: Rendered) -> None:
    """A replica count in the manifest would reset KEDA's choice on every apply."""
    for scaled in trial.of_kind("ScaledObject"):
        deployment = trial.named("Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        assert "replicas" not in deployment["spec"]


def test_no_worker_kind_scales_to_zero_while_serve_waits_for_every_kind(trial: Rendered) -> None:
    """serve's readiness is /readyz, which wants a worker of each kind: at zero replicas of a
    kind serve would leave its Service, and nothing would ever fill the queue again."""
    serve = pod_spec(trial.named("Deployment", "compaction-worker-serve"))["containers"][0]
    assert serve["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for scaled in trial.of_kind("ScaledObject"):
        assert scaled["spec"]["minReplicaCount"] >= 1
        assert "idleReplicaCount" not in scaled["spec"]


# --- real workers: the probes answer, then fail ------------------------------------------------


def pod_like_env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    """What a worker container has, on this machine: the image's variables (its paths moved
    under tmp_path), the Redis, and HOSTNAME the host name Celery's %h expands to (a pod's
    HOSTNAME is its name, which is also its host name)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        COMPACTOR_CONFIG=str(CONFIG_COPY),
        COMPACTOR_TRANSCRIPT_DIR=str(tmp_path / "transcripts"),
        COMPACTOR_REDIS_URL=redis_url,
        HOSTNAME=socket.gethostname(),
    )
    return env


def run_probes(probes: dict[str, dict[str, Any]], env: dict[str, str]) -> dict[str, int]:
    """Each probe's command at once, as the kubelet runs it; name -> exit code."""
    running = {
        name: subprocess.Popen(
            probe["exec"]["command"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for name, probe in probes.items()
    }
    return {
        name: proc.wait(timeout=probes[name]["timeoutSeconds"] + 60)
        for name, proc in running.items()
    }


@pytest.mark.slow
def test_a_worker_started_as_the_manifest_says_answers_its_probe_then_fails_it(
    trial: Rendered, redis_url: str, tmp_path: Path
) -> None:
    """Each worker Deployment's command (through the package's CLI, as the image runs it),
    against a real Redis: its startup probe succeeds within the probe's own budget, and the
    same probe fails once the worker is gone (a live worker of the other kind still
    answering: the probe is the pod's own node's)."""
    env = pod_like_env(redis_url, tmp_path)
    workers = {
        d["metadata"]["name"]: c
        for d, c in ours(trial.objects)
        if c["command"][:2] == ["compactor", "worker"]
    }
    procs = {}
    try:
        for name, container in workers.items():
            with (tmp_path / f"{name}.log").open("ab") as log:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "worker", *container["command"][1:]],
                    env=env,
                    cwd=tmp_path,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        pending = {name: c["startupProbe"] for name, c in workers.items()}
        budget = max(p["periodSeconds"] * p["failureThreshold"] for p in pending.values())
        deadline = time.monotonic() + budget
        while pending and time.monotonic() < deadline:
            for name, code in run_probes(pending, env).items():
                if code == 0:
                    del pending[name]
                assert procs[name].poll() is None, (tmp_path / f"{name}.log").read_text()
        assert not pending, f"no answer from {sorted(pending)}"
        first, second = sorted(workers)
        stop(procs.pop(first))
        codes = run_probes({n: workers[n]["livenessProbe"] for n in (first, second)}, env)
        assert codes[first] != 0 and codes[second] == 0, codes
    finally:
        for proc in procs.values():
            stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as the kubelet stops a container; SIGKILL after a while."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --- security, resources, budgets, Services ---------------------------------------------------


def app_uid() -> int:
    runtime = dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))[-1]
    (uid,) = [
        rest.split("=", 1)[1]
        for kind, rest in runtime
        if kind == "ARG" and rest.startswith("APP_UID=")
    ]
    return int(uid)


def test_every_pod_is_restricted_and_ours_run_as_the_images_user(trial: Rendered) -> None:
    """The restricted Pod Security Standard: non-root, no privilege escalation, no
    capabilities, the runtime's seccomp profile, nothing of the host. What is written goes to
    an emptyDir or a volume claim: the root filesystem is read-only."""
    for deployment in trial.of_kind("Deployment"):
        spec = pod_spec(deployment)
        where = deployment["metadata"]["name"]
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not {"hostNetwork", "hostPID", "hostIPC"} & spec.keys(), where
        assert spec["automountServiceAccountToken"] is False, where
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert all(
            {"emptyDir", "persistentVolumeClaim", "configMap"} & v.keys() for v in volumes.values()
        )
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context == {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }, where
            for mount in container["volumeMounts"]:
                assert mount.get("readOnly") or "configMap" not in volumes[mount["name"]]
    for deployment, container in ours(trial.objects):
        pod = pod_spec(deployment)["securityContext"]
        assert pod["runAsUser"] == pod["runAsGroup"] == pod["fsGroup"] == app_uid()
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts, "tempfile's directory, writable"


def test_the_transcripts_are_one_volume_for_every_pod_that_reads_or_writes_them(
    trial: Rendered,
) -> None:
    transcript_dir = image_env()["COMPACTOR_TRANSCRIPT_DIR"]
    claims = {}
    for deployment, container in ours(trial.objects):
        volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
        mounted = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
        if transcript_dir in mounted:
            claims[deployment["metadata"]["name"]] = mounted[transcript_dir][
                "persistentVolumeClaim"
            ]["claimName"]
    assert set(claims) == {f"compaction-worker-{k}" for k in ("evaluate", "summarize", "serve")}
    (claim,) = set(claims.values())
    base_claim = render(BASE).named("PersistentVolumeClaim", claim)
    assert base_claim["spec"]["accessModes"] == ["ReadWriteMany"], "pods on several nodes"


def quantity(text: str | int) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``768Mi``, ``1Gi``) as a number."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text))
    assert match, text
    return float(match.group(1)) * units.get(match.group(2), 1)


def test_every_container_has_requests_and_limits(trial: Rendered) -> None:
    for deployment, container in containers(trial.objects):
        resources = container["resources"]
        for resource in ("cpu", "memory"):
            request = quantity(resources["requests"][resource])
            assert 0 < request <= quantity(resources["limits"][resource]), deployment["metadata"]
    redis_container = pod_spec(trial.named("Deployment", "compaction-worker-redis"))["containers"][
        0
    ]
    args = redis_container["args"]
    maxmemory = args[args.index("--maxmemory") + 1]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert args[args.index("--appendonly") + 1] == "yes"
    limit = quantity(redis_container["resources"]["limits"]["memory"])
    assert quantity(maxmemory.replace("mb", "Mi")) < 0.75 * limit, "room for an AOF rewrite's fork"


def selects(selector: dict[str, str], deployment: dict[str, Any]) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return selector.items() <= labels.items()


def test_disruption_budgets_allow_drains_one_pod_at_a_time(trial: Rendered) -> None:
    deployments = trial.of_kind("Deployment")
    minimum = {
        s["spec"]["scaleTargetRef"]["name"]: s["spec"]["minReplicaCount"]
        for s in trial.of_kind("ScaledObject")
    }
    budgeted = set()
    for budget in trial.of_kind("PodDisruptionBudget"):
        (target,) = [
            d for d in deployments if selects(budget["spec"]["selector"]["matchLabels"], d)
        ]
        name = target["metadata"]["name"]
        budgeted.add(name)
        replicas = minimum.get(name, target["spec"].get("replicas", 1))
        spec = budget["spec"]
        allowed = spec.get("maxUnavailable", replicas - spec.get("minAvailable", 0))
        assert allowed >= 1, f"{name}: a drain could never evict its pod at {replicas} replicas"
        assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert budgeted == {f"compaction-worker-{k}" for k in ("evaluate", "summarize", "serve")}


def test_services_select_their_pods_and_inject_no_setting_like_variables(trial: Rendered) -> None:
    """Kubernetes gives every pod of the namespace (the agents' too, where service links are on)
    NAME_SERVICE_HOST, NAME_PORT, ... for each Service: none may start with COMPACTOR_, where an
    agent reading its settings from the environment would take them for settings. Our own pods
    turn service links off."""
    deployments = trial.of_kind("Deployment")
    for service in trial.of_kind("Service"):
        prefix = service["metadata"]["name"].upper().replace("-", "_") + "_"
        assert not prefix.startswith("COMPACTOR_"), prefix
        (target,) = [d for d in deployments if selects(service["spec"]["selector"], d)]
        ports = {p["name"] for c in pod_spec(target)["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    # Why: a Service named compactor-http would give every pod COMPACTOR_HTTP_PORT=tcp://...
    assert "COMPACTOR_HTTP_PORT" in env_names()
    for deployment in deployments:
        assert pod_spec(deployment)["enableServiceLinks"] is False


def test_the_page_is_listed_and_linked() -> None:
    assert "[kubernetes.md](kubernetes.md)" in (REPO / "docs" / "README.md").read_text()
    assert "docs/kubernetes.md" in (REPO / "README.md").read_text()
