"""Which job `jaxtrain.distributed.initialize` joins without flags: the clusters JAX's own detection
finds (SLURM, Open MPI, Kubernetes indexed Jobs and JobSets, Cloud TPU slices), never a job of one
process, and the flags still win. Environments are faked; `jax.distributed.initialize` is replaced
by a recorder, so nothing here starts a runtime."""

import sys

import jax
import pytest

from jaxtrain import ConfigError, DistConfig
from jaxtrain._src import distributed

CLUSTER_VARS = ("SLURM_NTASKS", "SLURM_STEP_NODELIST", "OMPI_COMM_WORLD_SIZE", "KUBERNETES_SERVICE_HOST",
                "JOB_COMPLETION_INDEX", "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "MEGASCALE_NUM_SLICES")


@pytest.fixture
def env(monkeypatch):
    for name in CLUSTER_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def joined(env):
    """The arguments `jax.distributed.initialize` was called with (it is not really started)."""
    calls = []
    env.setattr(jax.distributed, "initialize", lambda *args, **kwargs: calls.append(args))
    env.setattr(distributed, "start_watchdog", lambda timeout_s: None)
    return calls


def _on_tpu_vm(env, on=True):
    from jax._src import cloud_tpu_init
    from jax._src.clusters import cloud_tpu_cluster
    env.setattr(cloud_tpu_init, "running_in_cloud_tpu_vm", on)
    env.setattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", on)  # imported by value there


def test_no_cluster_by_default(env):
    assert distributed.detected_cluster() is None


@pytest.mark.parametrize("variables, expected", [
    ({"SLURM_NTASKS": "4", "SLURM_STEP_NODELIST": "n[1-2]"}, "SLURM"),
    ({"SLURM_NTASKS": "4"}, None),  # the batch script's own shell: no task of a step
    ({"SLURM_NTASKS": "1", "SLURM_STEP_NODELIST": "n1"}, None),  # a step of one task
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "Open MPI"),
    ({"OMPI_COMM_WORLD_SIZE": "1"}, None),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOB_COMPLETION_INDEX": "3"}, "Kubernetes"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, None),  # a lone pod (a notebook, a service): trains alone
])
def test_clusters_found_from_the_environment(env, variables, expected):
    for name, value in variables.items():
        env.setenv(name, value)
    assert distributed.detected_cluster() == expected


def test_a_cloud_tpu_slice_of_several_hosts(env):
    env.setenv("TPU_WORKER_HOSTNAMES", "t1k-0,t1k-1,t1k-2,t1k-3")
    env.setenv("MEGASCALE_NUM_SLICES", "1")  # read from the environment, not the metadata server
    assert distributed.detected_cluster() is None  # not on a TPU VM: the variables alone are not a slice
    _on_tpu_vm(env)
    assert distributed.detected_cluster() == "Cloud TPU"
    env.setenv("TPU_WORKER_HOSTNAMES", "t1k-0")
    assert distributed.detected_cluster() is None  # one host: nothing to join


def test_a_detected_cluster_is_joined_through_jax_detection(env, joined):
    env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    env.setattr(jax, "process_count", lambda: 2)
    assert distributed.initialize(DistConfig(timeout_s=5)) == 2
    assert joined == [(None, None, None)]  # JAX finds the coordinator, the count and the id itself


def test_no_cluster_no_runtime(env, joined):
    assert distributed.initialize(DistConfig()) == 1
    assert joined == []


def test_a_pod_without_the_kubernetes_client_is_one_line(env, joined):
    env.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    env.setenv("JOB_COMPLETION_INDEX", "0")
    env.setitem(sys.modules, "kubernetes", None)  # not installed
    with pytest.raises(ConfigError) as error:
        distributed.initialize(DistConfig())
    message = str(error.value)
    assert "\n" not in message and "pip install 'jax[k8s]'" in message and "coordinator" in message
    assert joined == []


def test_flags_win_over_a_detected_cluster(env, joined):
    env.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    env.setenv("JOB_COMPLETION_INDEX", "1")
    env.setitem(sys.modules, "kubernetes", None)  # not needed when the flags say where to go
    env.setattr(distributed, "_check_coordinator", lambda address, process_id, timeout_s: None)
    env.setattr(jax, "process_count", lambda: 2)
    distributed.initialize(DistConfig(coordinator="10.0.0.9:1234", num_processes=2, process_id=1))
    assert joined == [("10.0.0.9:1234", 2, 1)]


def test_one_process_by_choice_trains_alone_in_a_cluster(env, joined):
    env.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    env.setenv("JOB_COMPLETION_INDEX", "2")  # a pod of an indexed Job of sweep workers
    assert distributed.initialize(DistConfig(num_processes=1)) == 1
    assert joined == []


def test_a_sweep_trial_trains_alone():
    from jaxtrain.tools.sweep import _alone

    assert _alone(DistConfig()).num_processes == 1
    flags = DistConfig(coordinator="h:1", num_processes=4, process_id=0)
    assert _alone(flags) == flags  # given by the user: kept


def test_the_kubernetes_training_template_is_one_job_of_its_devices():
    """examples/kubernetes/train-indexed-job.yaml: an indexed Job (what the detection reads), all its pods at
    once, reached through its headless service, its mesh as large as its pods' GPUs. (The sweep template
    runs in tests/e2e/test_sweep_workers.py.)"""
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parents[2] / "examples/kubernetes/train-indexed-job.yaml"
    service, job = yaml.safe_load_all(path.read_text())
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
    [container] = pod["containers"]
    command = container["command"]
    devices = spec["completions"] * container["resources"]["limits"]["nvidia.com/gpu"]
    assert command[command.index("--mesh") + 1] == f"data={devices}"
    assert int(command[command.index("--batch-size") + 1]) % devices == 0
    assert not [part for part in command if part.startswith("--dist")]  # found by the detection, not flags
