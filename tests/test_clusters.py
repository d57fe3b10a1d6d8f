"""The cluster from a scheduler's variables (distribute/schedulers.py), the examples'
manifests against Kubernetes' schemas, and a worker's share of each batch."""

import json
import os

import numpy as np
import pytest
import yaml

from amptrain.data.pipeline import plan_dataset
from amptrain.distribute import Cluster
from amptrain.distribute.schedulers import expand_hostlist, tasks_per_node
from amptrain.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KUBERNETES = os.path.join(ROOT, "examples", "kubernetes")


def slurm(rank, tasks=4, nodes="node[1-2]", per_node="2(x2)", local=None, **more):
    env = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(tasks)}
    env.update({"SLURM_JOB_NODELIST": nodes, "SLURM_TASKS_PER_NODE": per_node, **more})
    if local is not None:
        env["SLURM_LOCALID"] = str(local)
    return env


def test_slurm_node_lists_and_tasks_per_node_expand_as_scontrol_does():
    assert expand_hostlist("node[01-03,7],gpu-a[1-2],solo") == [
        "node01",
        "node02",
        "node03",
        "node7",
        "gpu-a1",
        "gpu-a2",
        "solo",
    ]
    assert expand_hostlist("c[098-101]") == ["c098", "c099", "c100", "c101"]
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1] and tasks_per_node("4") == [4]


def test_a_slurm_step_is_a_cluster_of_its_tasks_with_ports_apart_on_a_node():
    env = slurm(3, local=1)
    cluster = Cluster.from_env(env)
    # block layout: ranks 0, 1 on node1, 2, 3 on node2; port base 20000 + 10 x (4242 mod 4000)
    assert cluster.addresses == ("node1:22420", "node1:22421", "node2:22420", "node2:22421")
    assert (cluster.index, cluster.num_workers, cluster.source, cluster.is_chief) == (3, 4, "SLURM", False)
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": list(cluster.addresses)},
        "task": {"type": "worker", "index": 3},
    }
    # AMPTRAIN_PORT sets the base; one task is one process; the step's own variables win
    assert Cluster.from_env(slurm(0, AMPTRAIN_PORT="31000")).addresses[:2] == ("node1:31000", "node1:31001")
    assert not Cluster.from_env(slurm(0, tasks=1, nodes="node1", per_node="1")).is_multi_worker
    step = slurm(1, SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NODELIST="node[3-4]", SLURM_STEP_TASKS_PER_NODE="1(x2)")
    assert Cluster.from_env(step).addresses == ("node3:22420", "node4:22420")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (slurm(1, local=0), r"task 1 has local id 0, but a block layout puts it at 1; .*--distribution=block"),
        (slurm(0, per_node="3"), r"2 node\(s\) \['node1', 'node2'\] with tasks per node \[3, 3\] do not make"),
        (slurm(9), r"SLURM_PROCID: expected 0 to 3, received 9"),
        ({**slurm(0), "SLURM_JOB_NODELIST": ""}, r"SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: not set"),
        (slurm(0, nodes="node[01-"), r"SLURM node list: cannot read 'node\[01-' at character 5"),
        (slurm(0, nodes="node[a-b]"), r"SLURM node list: cannot read 'node\[a-b\]' at character 5"),
        (slurm(0, nodes="node[3-1]"), r"SLURM node list: range '3-1' in 'node\[3-1\]' runs backwards"),
        (slurm(0, AMPTRAIN_PORT="http"), r"AMPTRAIN_PORT: expected an integer, received 'http'"),
        (slurm(0, AMPTRAIN_PORT="70000"), r"AMPTRAIN_PORT: expected a port from 1 to 65535, received 70000"),
    ],
)
def test_a_slurm_step_that_does_not_add_up_is_one_line(env, message):
    with pytest.raises(ConfigError, match=message):
        Cluster.from_env(env)


def test_an_indexed_job_is_a_cluster_by_its_completion_index_and_the_rest_is_chosen():
    env = {
        "JOB_COMPLETION_INDEX": "1",
        "AMPTRAIN_WORKERS": "2",
        "AMPTRAIN_WORKER_ADDRESS": "amptrain-{index}.amptrain:2222",
    }
    cluster = Cluster.from_env(dict(env))  # (it writes TF_CONFIG into the environment it is given)
    assert cluster.addresses == ("amptrain-0.amptrain:2222", "amptrain-1.amptrain:2222") and cluster.index == 1
    assert cluster.source == "Kubernetes"
    # TF_CONFIG (the TFJob's, or launch's) is read as it is; "none" ignores every variable
    launched = {
        "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}})
    }
    assert Cluster.from_env({**launched, **slurm(3)}).addresses == ("a:1", "b:2")
    assert not Cluster.from_env({**launched, **env}, source="none").is_multi_worker
    with pytest.raises(ConfigError, match=r"runtime.cluster = 'tf_config': TF_CONFIG is not set"):
        Cluster.from_env(env, source="tf_config")
    with pytest.raises(ConfigError, match=r"AMPTRAIN_WORKERS: not set"):
        Cluster.from_env({}, source="kubernetes")
    odd = {**env, "AMPTRAIN_WORKER_ADDRESS": "amptrain-{index}.{service}:{port}"}
    with pytest.raises(ConfigError, match=r"AMPTRAIN_WORKER_ADDRESS: .* does not format \(KeyError: 'service'\)"):
        Cluster.from_env(odd)


def test_a_workers_share_of_a_batch_plan_builds_only_its_rows():
    class Plan:
        def batch(self, step):
            return np.arange(step * 8, step * 8 + 8), 5

    built = []
    import tensorflow as tf

    def build(indices, length):
        built.extend(indices.tolist())
        return np.asarray(indices, np.int32)

    spec = tf.TensorSpec((None,), tf.int32)
    halves = [list(plan_dataset(Plan(), build, spec, 1, 2, share=(p, 2)).as_numpy_iterator()) for p in (0, 1)]
    assert [b.tolist() for b in halves[0]] == [[8, 9, 10, 11], [16, 17, 18, 19]]
    assert [b.tolist() for b in halves[1]] == [[12, 13, 14, 15], [20, 21, 22, 23]]
    assert sorted(built) == list(range(8, 24))  # every row built once, by one worker


def manifests(name):
    with open(os.path.join(KUBERNETES, name), encoding="utf-8") as f:
        return list(yaml.safe_load_all(f))


# The TFJob's own fields, as the training operator's CRD (kubeflow.org_tfjobs.yaml, v1)
# declares them; its pod templates are checked against Kubernetes' own PodTemplateSpec.
TFJOB = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v1"},
        "kind": {"const": "TFJob"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["tfReplicaSpecs"],
            "additionalProperties": False,
            "properties": {
                "enableDynamicWorker": {"type": "boolean"},
                "successPolicy": {"type": "string"},
                "runPolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "activeDeadlineSeconds": {"type": "integer"},
                        "backoffLimit": {"type": "integer"},
                        "cleanPodPolicy": {"enum": ["None", "Running", "All"]},
                        "schedulingPolicy": {"type": "object"},
                        "suspend": {"type": "boolean"},
                        "ttlSecondsAfterFinished": {"type": "integer"},
                    },
                },
                "tfReplicaSpecs": {
                    "type": "object",
                    "propertyNames": {"enum": ["Chief", "Master", "Worker", "PS", "Evaluator"]},
                    "additionalProperties": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["template"],
                        "properties": {
                            "replicas": {"type": "integer", "minimum": 0},
                            "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
                            "template": {"type": "object"},
                        },
                    },
                },
            },
        },
    },
}


def test_the_kubernetes_manifests_are_valid_against_the_schemas():
    jsonschema = pytest.importorskip("jsonschema")
    validate = pytest.importorskip("kubernetes_validate")
    version = validate.latest_version()
    service, job = manifests("indexed-job.yaml")
    for resource in (service, job):
        validate.validate(resource, version, strict=True)  # unknown fields are errors too
    assert job["spec"]["completionMode"] == "Indexed" and service["spec"]["clusterIP"] == "None"
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    variables = {v["name"]: v["value"] for v in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert variables["AMPTRAIN_WORKERS"] == str(job["spec"]["completions"])
    (tfjob,) = manifests("tfjob.yaml")
    jsonschema.validate(tfjob, TFJOB)
    for replica in tfjob["spec"]["tfReplicaSpecs"].values():
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "t"},
            "template": replica["template"],
        }
        validate.validate(template, version, strict=True)
    with pytest.raises(validate.ValidationError, match="completionMod"):  # the check can fail
        validate.validate({**job, "spec": {**job["spec"], "completionMod": "Indexed"}}, version, strict=True)
