"""Many processes: joining a job through `jax.distributed`, and not hanging when a peer dies.

`initialize(config)` starts JAX's multi-controller runtime from a `DistConfig`, or, without a
coordinator, from whatever cluster JAX's own detection finds (a SLURM step of several tasks, an Open
MPI job, a pod of a Kubernetes indexed Job or JobSet, a host of a Cloud TPU slice), before anything
touches a device. Each process then sees every device of the job in `jax.devices()`; the mesh
spans them all and the same compiled program runs in every process.

A process that dies leaves the others blocked inside a collective. JAX's coordination service
notices only after its heartbeat timeout and then aborts the survivors with a C++ stack trace.
`initialize` therefore also starts a watchdog thread: every process publishes a heartbeat in the
coordination service's key-value store each second; a peer whose heartbeat stops for
`timeout_s`, or which exited while this process still runs `timeout_s` later, makes this process
print one line and exit with code 4. Checkpoints already written stay intact, so every process can
be restarted to resume the run.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time

import jax

from jaxtrain._src.config import DistConfig
from jaxtrain._src.errors import ConfigError, argument, render, setting

PEER_LOST_EXIT_CODE = 4
_KEY = "jaxtrain/heartbeat/"
_watchdog: "_Watchdog | None" = None


def detected_cluster() -> str | None:
    """The kind of job of several processes this process is one of, as `jax.distributed.initialize()`
    would find it without arguments: 'SLURM', 'Open MPI', 'Kubernetes' or 'Cloud TPU'; None when alone.

    Each test reads the environment only (plus, on a Cloud TPU VM, its metadata, as JAX does), and a
    job of one process is not a cluster: a SLURM batch script's own shell is no task of a step, a
    lone pod or a one-host TPU VM trains alone.
    """
    if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_STEP_NODELIST" in os.environ:
        return "SLURM"
    if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
        return "Open MPI"
    # An indexed Job (JobSets are made of them) numbers its pods: JOB_COMPLETION_INDEX is the process id.
    if "KUBERNETES_SERVICE_HOST" in os.environ and "JOB_COMPLETION_INDEX" in os.environ:
        return "Kubernetes"
    if _tpu_hosts() > 1:
        return "Cloud TPU"
    return None


def _tpu_hosts() -> int:
    """The hosts of the Cloud TPU slice(s) this VM belongs to (JAX's own detection); 0 off a TPU VM."""
    try:
        from jax._src import cloud_tpu_init
        from jax._src.clusters import cloud_tpu_cluster as tpu
    except ImportError:  # a JAX without them: nothing to detect
        return 0
    if not cloud_tpu_init.running_in_cloud_tpu_vm:
        return 0
    for env in (tpu.GkeTpuCluster, tpu.GceTpuCluster):
        try:
            if env.is_env_present():
                return int(env.get_process_count())
        except Exception:  # noqa: BLE001 - metadata server unreachable and the like: not a slice we can join
            continue
    return 0


def _check_kubernetes_client() -> None:
    """JAX finds the other pods of a Kubernetes Job through its API, with the `kubernetes` package.

    Raises:
      ConfigError: the package is missing.
    """
    try:
        import kubernetes  # type: ignore[import-not-found]  # noqa: F401 - optional: jax[k8s] installs it
    except ImportError:
        raise ConfigError("this process is a pod of a Kubernetes indexed Job, and JAX finds the Job's other pods "
                          "with the `kubernetes` package: pip install 'jax[k8s]' (or give "
                          f"{setting('dist.coordinator')}, {setting('dist.num_processes')} and "
                          f"{setting('dist.process_id')} yourself)") from None


def initialize(config: DistConfig = DistConfig()) -> int:
    """Joins the job described by `config` (or detected from the environment); returns the number of
    processes. One process without a coordinator or a detected cluster: nothing happens. Call it
    before anything uses a device.

    Raises:
      ConfigError: the coordinator cannot be reached within `config.timeout_s`, or the job's
        processes do not agree.
    """
    if jax.distributed.is_initialized():
        return jax.process_count()
    if config.num_processes == 1 and not config.coordinator:  # alone by choice, whatever the environment
        return 1
    cluster = None if config.coordinator else detected_cluster()
    if not config.coordinator and cluster is None:
        return 1
    if cluster == "Kubernetes":
        _check_kubernetes_client()
    where = config.coordinator or f"the {cluster} job's first node"
    timeout = max(1, round(config.timeout_s))
    if config.coordinator:  # JAX aborts the process when it cannot connect: check first, clearly
        _check_coordinator(config.coordinator, config.process_id, timeout)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices of several processes
    try:
        jax.distributed.initialize(
            config.coordinator or None,
            config.num_processes or None,
            config.process_id if config.coordinator else None,
            initialization_timeout=timeout,
            heartbeat_timeout_seconds=max(3 * timeout, 10),  # our watchdog speaks first
        )
    except Exception as e:  # noqa: BLE001 - XlaRuntimeError, RuntimeError, ValueError from cluster detection
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cannot join the job through the coordinator at {where} within {timeout} s "
                          f"(process {config.process_id if config.coordinator else '?'}): {reason}; check that "
                          "process 0 runs, the address and port are right and reachable, and every process "
                          f"gives the same {setting('dist.num_processes')}") from None
    start_watchdog(config.timeout_s)
    return jax.process_count()


def _check_coordinator(address: str, process_id: int, timeout_s: float) -> None:
    """Process 0: the coordinator's port can be listened on. Others: it accepts connections within
    `timeout_s`.

    Raises:
      ConfigError: an unknown host, a port in use, or no coordinator listening in time.
    """
    host, port = address.rsplit(":", 1)
    try:
        family = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0][0]
    except (OSError, ValueError) as e:
        raise ConfigError(f"{setting('dist.coordinator', address)}: cannot resolve host {host!r} ({e})",
                          coordinator=address) from None
    if process_id == 0:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("", int(port)))
            except OSError as e:
                raise ConfigError(f"process 0 cannot serve the coordinator on port {port}: {e.strerror}; choose a "
                                  f"free port in {setting('dist.coordinator')}", coordinator=address) from None
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()  # resolved as just above
            return
        except OSError:
            if time.monotonic() > deadline:
                raise ConfigError(f"process {process_id} cannot reach the coordinator at {address} within "
                                  f"{timeout_s:.0f} s: start process 0 with the same {setting('dist.coordinator')}, "
                                  f"or check the host, port and firewall (raise the wait with "
                                  f"{setting('dist.timeout_s')})", coordinator=address) from None
            time.sleep(0.2)


def start_watchdog(timeout_s: float) -> None:
    """Starts the heartbeat watchdog of this process (see the module docstring); once per process."""
    global _watchdog
    if _watchdog is None and jax.process_count() > 1:
        _watchdog = _Watchdog(timeout_s)
        atexit.register(_watchdog.exited)


class _Watchdog:
    def __init__(self, timeout_s: float):
        from jax._src import distributed as jax_distributed

        client = jax_distributed.global_state.client
        assert client is not None, "the watchdog starts after jax.distributed.initialize"
        self._client = client
        self._me, self._n = jax.process_index(), jax.process_count()
        self._timeout = timeout_s
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="jaxtrain-watchdog", daemon=True).start()

    def exited(self) -> None:
        """Marks this process as finished, so peers know it did not die."""
        self._stop.set()
        try:
            self._client.key_value_set(f"{_KEY}{self._me}", "exited", allow_overwrite=True)
        except Exception:  # noqa: BLE001 - the coordinator may be gone already
            pass

    def _run(self) -> None:
        beat = 0
        last_value: dict[int, str | None] = {}  # peer -> its last heartbeat value, "exited" at its end
        last_change: dict[int, float] = {}  # peer -> when its value last changed (time.monotonic)
        exited_at: dict[int, float] = {}
        while not self._stop.wait(min(1.0, self._timeout / 5)):
            now = time.monotonic()
            try:
                beat += 1
                self._client.key_value_set(f"{_KEY}{self._me}", str(beat), allow_overwrite=True)
                values = dict(self._client.key_value_dir_get(_KEY))
            except Exception as e:  # noqa: BLE001 - the coordination service (process 0) is gone
                if self._stop.is_set():
                    return
                self._fail(f"lost contact with the coordinator (process 0): {str(e).splitlines()[0][:120]}")
            for peer in range(self._n):
                if peer == self._me:
                    continue
                value = values.get(f"{_KEY}{peer}")
                if value != last_value.get(peer, object()):
                    last_value[peer], last_change[peer] = value, now
                if value == "exited":
                    exited_at.setdefault(peer, now)
                    if now - exited_at[peer] > self._timeout:
                        self._fail(f"process {peer} of {self._n} exited {self._timeout:.0f} s ago while this one "
                                   "still runs (it probably stopped with an error; see its log)")
                elif now - last_change.get(peer, now) > self._timeout:
                    self._fail(f"process {peer} of {self._n} sent no heartbeat for {self._timeout:.0f} s "
                               "(killed, crashed or hung)")

    def _fail(self, reason: str) -> None:
        if self._stop.is_set():
            return
        print(render(f"error: {reason}; stopping process {self._me} too. Checkpoints written so far are intact: "
                     f"start every process again with {argument('resume', True)} to continue"),
              file=sys.stderr, flush=True)
        os._exit(PEER_LOST_EXIT_CODE)
