"""infra/ without a Docker engine or a cluster: every manifest parses and has the keys its
controller needs, the Ray launcher config passes Ray's own schema and defaults, the embedded
DAG and training config validate with our own loaders, Dockerfiles have a sane shape, and the
Slurm script is valid bash that runs ``torchrun ... -m training``."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO

INFRA = REPO / "infra"
K8S_FILES = ["kuberay-raycluster.yaml", "kuberay-rayjob.yaml", "pytorchjob-train.yaml"]


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((INFRA / name).read_text()) if d is not None]


def _by_kind(name: str, kind: str) -> dict:
    (doc,) = [d for d in _docs(name) if d["kind"] == kind]
    return doc


def test_every_yaml_parses_and_readme_names_each_file():
    files = sorted(INFRA.glob("*.yaml"))
    assert {f.name for f in files} == set(K8S_FILES) | {"ray-cluster.yaml"}
    for f in files:
        assert _docs(f.name), f
    readme = (INFRA / "README.md").read_text()
    for f in files + [INFRA / "Dockerfile", INFRA / "Dockerfile.gpu", INFRA / "slurm-train.sbatch"]:
        assert f"infra/{f.name}" in readme, f"README does not show how to use {f.name}"


@pytest.mark.parametrize("name", K8S_FILES)
def test_k8s_objects_have_required_keys(name):
    for doc in _docs(name):
        assert {"apiVersion", "kind", "metadata"} <= set(doc), (name, doc.get("kind"))
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), doc["metadata"]
        if doc["kind"] in ("ConfigMap", "Secret"):
            assert doc.get("data"), (name, doc["kind"])
        else:
            assert isinstance(doc.get("spec"), dict), (name, doc["kind"])


def _pod_specs(obj) -> list[dict]:
    """Every pod template spec inside a manifest (anything with a `containers` list)."""
    out = []
    if isinstance(obj, dict):
        if isinstance(obj.get("containers"), list):
            out.append(obj)
        for v in obj.values():
            out += _pod_specs(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _pod_specs(v)
    return out


@pytest.mark.parametrize("name", K8S_FILES)
def test_pods_mount_what_they_reference(name):
    docs = _docs(name)
    claims = {d["metadata"]["name"] for d in _docs("kuberay-raycluster.yaml") if d["kind"] == "PersistentVolumeClaim"}
    config_maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    specs = [s for d in docs for s in _pod_specs(d.get("spec", {}))]
    assert specs
    for spec in specs:
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            assert c.get("image") and c.get("name"), c
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, (name, c["name"], m["name"])
        for v in volumes.values():
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims
            if "configMap" in v:
                assert v["configMap"]["name"] in config_maps


def test_kuberay_cluster_and_service_sidecar():
    rc = _by_kind("kuberay-raycluster.yaml", "RayCluster")
    assert rc["apiVersion"] == "ray.io/v1"
    head = rc["spec"]["headGroupSpec"]
    assert "rayStartParams" in head
    containers = {c["name"]: c for c in head["template"]["spec"]["containers"]}
    assert "ray-head" in containers
    serve = containers["refinery-service"]
    args = serve["args"]
    assert args[0] == "serve" and any(a.startswith("--token-file=") for a in args)
    assert any(a.startswith("--allowed-root=") for a in args) and "--host=0.0.0.0" in args
    assert serve["readinessProbe"]["httpGet"]["path"] == "/healthz"  # the one route without a token
    for group in rc["spec"]["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        assert "rayStartParams" in group and group["template"]["spec"]["containers"]
    svc = _by_kind("kuberay-raycluster.yaml", "Service")
    labels = head["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())


def test_kuberay_job_runs_a_valid_dag():
    from curation.pipeline.dag import parse_dag

    job = _by_kind("kuberay-rayjob.yaml", "RayJob")
    assert job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[:2] == ["refinery", "run"] and "--out" in argv and "--address" in argv
    assert "headGroupSpec" in spec["rayClusterSpec"] and spec["rayClusterSpec"]["workerGroupSpecs"]
    assert spec["shutdownAfterJobFinishes"] is True
    # the DAG the entrypoint names is the one in the ConfigMap, mounted where it says
    cm = _by_kind("kuberay-rayjob.yaml", "ConfigMap")
    (fname, text), = cm["data"].items()
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mount = next(m for c in head["containers"] for m in c.get("volumeMounts", []) if m["name"] == "pipeline")
    assert argv[2] == f"{mount['mountPath']}/{fname}"
    dag = parse_dag(yaml.safe_load(text), f"{fname} (ConfigMap)")
    assert all(p.startswith("/mnt/shared/") for spec_ in dag.inputs.values() for p in spec_.paths)


def test_pytorchjob_runs_torchrun_training_with_a_valid_config():
    from training.config import parse_config

    job = _by_kind("pytorchjob-train.yaml", "PyTorchJob")
    assert job["apiVersion"] == "kubeflow.org/v1"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"} and replicas["Master"]["replicas"] == 1
    for role in replicas.values():
        (c,) = role["template"]["spec"]["containers"]
        assert c["name"] == "pytorch"  # the training operator finds the container by this name
        cmd = c["command"] + c["args"]
        assert cmd[0] == "torchrun" and cmd[cmd.index("-m") + 1] == "training"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == int(job["spec"]["nprocPerNode"])
    cm = _by_kind("pytorchjob-train.yaml", "ConfigMap")
    cfg = parse_config(yaml.safe_load(cm["data"]["train.yaml"]), "train.yaml (ConfigMap)")
    assert cfg.train.global_batch % cfg.train.micro_batch == 0


def test_ray_launcher_config_passes_rays_schema_and_defaults():
    import os

    import jsonschema
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = yaml.safe_load((INFRA / "ray-cluster.yaml").read_text())
    for key in ("cluster_name", "max_workers", "provider", "auth", "available_node_types", "head_node_type",
                "head_start_ray_commands", "worker_start_ray_commands"):
        assert key in cfg, key
    assert cfg["head_node_type"] in cfg["available_node_types"]
    for name, nt in cfg["available_node_types"].items():
        assert "node_config" in nt and "resources" in nt, name
        assert nt.get("min_workers", 0) <= nt.get("max_workers", cfg["max_workers"]), name
    schema = json.loads((Path(os.path.dirname(ray.autoscaler.__file__)) / "ray-schema.json").read_text())
    jsonschema.validate(cfg, schema)
    validate_config(prepare_config(cfg))  # what `ray up` does before it touches the cloud
    head = " ".join(cfg["head_start_ray_commands"])
    assert "ray start --head" in head and "refinery serve" in head and "--token-file" in head
    assert any("ray start --address=$RAY_HEAD_IP:6379" in c for c in cfg["worker_start_ray_commands"])
    # the launcher starts the container with `bash`: the image's entrypoint must be cleared
    assert any(o.startswith("--entrypoint") for o in cfg["docker"]["run_options"])
    for cmd in cfg["initialization_commands"] + cfg["head_start_ray_commands"]:
        _bash_n(cmd)


def _bash_n(script: str) -> None:
    r = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert r.returncode == 0, (script, r.stderr)


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").strip() + " " if line.rstrip().endswith("\\") else line.strip()
        if not line.rstrip().endswith("\\"):
            word, _, rest = buf.partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


@pytest.mark.parametrize("name, base, entry", [
    ("Dockerfile", r"python:3\.11", "refinery"),
    ("Dockerfile.gpu", r"python:3\.11", "torchrun"),
])
def test_dockerfiles(name, base, entry):
    ins = _instructions(INFRA / name)
    known = {"FROM", "RUN", "COPY", "ENV", "WORKDIR", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "ARG", "LABEL"}
    assert {i for i, _ in ins} <= known, {i for i, _ in ins} - known
    assert ins[0][0] == "FROM" and re.match(base, ins[0][1]), ins[0]
    runs = [a for i, a in ins if i == "RUN"]
    assert any("pip install" in r for r in runs)
    for r in runs:
        _bash_n(r)
    copies = " ".join(a for i, a in ins if i == "COPY")
    for src in ("pyproject.toml", "curation", "training"):
        assert src in copies, src
    (entrypoint,) = [a for i, a in ins if i == "ENTRYPOINT"]
    argv = json.loads(entrypoint)  # exec form, so signals reach the process
    assert argv[-1] == entry and "tini" in argv[0]
    users = [a for i, a in ins if i == "USER"]
    assert users and users[-1] not in ("0", "root")
    # the build context is the repo: the matching .dockerignore keeps .venv and runs out
    ignore = [x for x in (INFRA / f"{name}.dockerignore").read_text().splitlines() if x and not x.startswith("#")]
    assert ignore[0] == "*" and "!curation/" in ignore and "!training/" in ignore


def test_gpu_image_runs_the_tests_torch_and_the_trainer_smoke_test():
    """The GPU image installs the torch the tests run (the Makefile's pin), at least the floor
    pyproject.toml declares, and its build runs ``python -m training.smoke`` (the whole trainer
    imported, two CPU steps), not just ``import training``."""
    from training.smoke import TORCH_FLOOR

    ins = _instructions(INFRA / "Dockerfile.gpu")
    pinned = re.search(r'"torch==([0-9.]+)"', (REPO / "Makefile").read_text()).group(1)
    args = dict(a.split("=", 1) for i, a in ins if i == "ARG" and "=" in a)
    assert args["TORCH_VERSION"] == pinned
    runs = " && ".join(a for i, a in ins if i == "RUN")
    assert '"torch==${TORCH_VERSION}"' in runs and "python -m training.smoke" in runs
    floor = re.search(r'"torch>=([0-9.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert tuple(int(x) for x in floor.split(".")[:2]) == TORCH_FLOOR
    assert tuple(int(x) for x in pinned.split(".")[:2]) >= TORCH_FLOOR


def test_trainer_smoke_command_passes_here():
    """What the image runs at build time, run here with this venv's torch."""
    r = subprocess.run([sys.executable, "-m", "training.smoke"], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "two CPU training steps: ok" in r.stdout and "attention on cpu:" in r.stdout


def test_images_in_manifests_are_the_ones_built_here():
    images = set()
    for name in K8S_FILES:
        for d in _docs(name):
            for spec in _pod_specs(d.get("spec", {})):
                images |= {c["image"] for c in spec["containers"]}
    images.add(yaml.safe_load((INFRA / "ray-cluster.yaml").read_text())["docker"]["image"])
    assert {i.rsplit("/", 1)[-1].split(":")[0] for i in images} == {"refinery", "refinery-gpu"}


def test_slurm_script_is_bash_and_runs_torchrun_training():
    path = INFRA / "slurm-train.sbatch"
    text = path.read_text()
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert text.startswith("#!/usr/bin/env bash")
    directives = dict(re.findall(r"^#SBATCH --([a-z-]+)=?(\S*)", text, re.M))
    assert {"nodes", "gpus-per-node", "ntasks-per-node", "requeue"} <= set(directives)
    assert directives["ntasks-per-node"] == "1"  # torchrun starts the per-GPU processes
    command = re.sub(r"\\\n\s*", " ", text)
    m = re.search(r"^srun .*torchrun (.*)$", command, re.M)
    assert m, "no `srun ... torchrun ...` line"
    args = m.group(1)
    assert re.search(r"-m training \"\$config\"", args) and "--resume auto" in args
    assert "--rdzv-backend=c10d" in args and "--nnodes=\"$SLURM_NNODES\"" in args
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", "-S", "warning", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout


def test_slurm_script_refuses_to_start_without_a_config():
    r = subprocess.run(["bash", str(INFRA / "slurm-train.sbatch")], capture_output=True, text=True)
    assert r.returncode == 2 and "usage: sbatch infra/slurm-train.sbatch" in r.stderr
