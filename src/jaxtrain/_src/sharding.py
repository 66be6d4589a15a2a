"""Meshes and shardings: data parallelism and fully sharded (FSDP) training with `jax.sharding`.

A run's devices form a 2-D mesh with axes `data` and `fsdp` (`TrainConfig(mesh="data=2,fsdp=2")`; `auto` is
every device on `data`). The global batch is split over both axes, so each device computes the
gradient of B / devices samples. Parameters and optimizer state are:

- replicated on every device when `fsdp` is 1 (data parallelism: XLA all-reduces the gradients);
- split over `fsdp` along their largest axis that `fsdp` divides when they hold at least
  `FSDP_MIN_ELEMENTS` elements; smaller or indivisible arrays stay replicated. Inside the step
  the parameters are constrained to be whole (`gather_params`) and the gradients to the split
  (`split_grads`): ZeRO-3, where XLA all-gathers each weight and reduces its gradient to the split
  (a reduce-scatter, or on XLA:CPU an all-reduce and a slice).
  Left to sharding propagation alone, XLA splits the activations instead and moves far more.

Nothing here is a runtime of its own: the compiled calls take these shardings as their in/out
shardings and XLA's SPMD partitioner inserts the collectives. With one device every sharding is
trivial and training is exactly the single-device program.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxtrain._src.config import AXES, parse_mesh
from jaxtrain._src.errors import ConfigError, setting

BATCH_AXES = AXES  # the batch axis is split over every device of the mesh
FSDP_MIN_ELEMENTS = 1024  # smaller arrays are replicated: splitting them saves little and costs a collective


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a run is laid out over its devices: the mesh and the shardings derived from it."""

    mesh: Mesh

    @property
    def num_devices(self) -> int:
        return self.mesh.devices.size

    @property
    def fsdp(self) -> int:
        return self.mesh.shape["fsdp"]

    @property
    def batch(self) -> NamedSharding:
        """A batch (B, ...), or a dataset's rows: split over every device."""
        return NamedSharding(self.mesh, PartitionSpec(BATCH_AXES))

    @property
    def stacked_batches(self) -> NamedSharding:
        """K stacked batches (K, B, ...): rows of each batch split over every device."""
        return NamedSharding(self.mesh, PartitionSpec(None, BATCH_AXES))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def constrain_batch(self, batch: Any) -> Any:
        """Inside a compiled call: `batch` (B, ...) split over every device (nothing on one device)."""
        if self.num_devices == 1:
            return batch
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, self.batch), batch)

    def gather_params(self, params: Any) -> Any:
        """Inside the step (FSDP): each parameter gathered whole where the model uses it, so that
        XLA all-gathers weights rather than moving activations (nothing without fsdp)."""
        if self.fsdp == 1:
            return params
        return jax.lax.with_sharding_constraint(params, jax.tree.map(lambda _: self.replicated, params))

    def split_grads(self, grads: Any) -> Any:
        """Inside the step (FSDP): each gradient reduced to its parameter's split."""
        if self.fsdp == 1:
            return grads
        return jax.lax.with_sharding_constraint(grads, self.state_shardings(grads))

    def spec(self, shape: tuple[int, ...]) -> PartitionSpec:
        """Where an array of the train state lives: split over `fsdp` along its largest axis that
        `fsdp` divides, when it has at least FSDP_MIN_ELEMENTS elements; else replicated."""
        if self.fsdp == 1 or math.prod(shape) < FSDP_MIN_ELEMENTS:
            return PartitionSpec()
        axes = [a for a in np.argsort([-d for d in shape], kind="stable") if shape[a] % self.fsdp == 0]
        if not axes:
            return PartitionSpec()
        spec: list[str | None] = [None] * len(shape)
        spec[int(axes[0])] = "fsdp"
        return PartitionSpec(*spec)

    def state_shardings(self, tree: Any) -> Any:
        """A `NamedSharding` for every leaf of a train state (arrays or shapes)."""
        return jax.tree.map(lambda x: NamedSharding(self.mesh, self.spec(tuple(np.shape(x)))), tree)

    def check_batch(self, batch_size: int, field: str = "batch_size") -> None:
        """Raises ConfigError when `batch_size` rows (the setting `field`) do not split evenly over the devices."""
        n = self.num_devices
        if batch_size % n:
            raise ConfigError(f"{setting(field, batch_size)} does not split over the mesh's {n} devices "
                              f"({self.describe()}); use a multiple of {n}, e.g. "
                              f"{setting(field, max(n, batch_size // n * n))}", batch_size=batch_size, num_devices=n)

    def describe(self) -> str:
        """E.g. `data=2 × fsdp=2 (4 cpu devices, 1 process)`."""
        shape = " × ".join(f"{a}={self.mesh.shape[a]}" for a in AXES)
        platform = self.mesh.devices.flat[0].platform
        processes = len({d.process_index for d in self.mesh.devices.flat})
        return (f"{shape} ({self.num_devices} {platform} device{'s' * (self.num_devices > 1)}, "
                f"{processes} process{'es' * (processes > 1)})")

    def rule(self, state: Any) -> str:
        """The partitioning of `state`, for the run header: what is split, and bytes per device."""
        leaves = jax.tree.leaves(state)
        per_device, full = state_bytes_per_device(self, state), sum(_nbytes(x) for x in leaves)
        if self.fsdp == 1:
            return f"parameters and optimizer state replicated on every device ({_mib(full)} each)"
        split = sum(1 for x in leaves if self.spec(tuple(np.shape(x))) != PartitionSpec())
        return (f"parameters and optimizer state split over fsdp={self.fsdp} along their largest axis that "
                f"{self.fsdp} divides ({split} of {len(leaves)} arrays; those under {FSDP_MIN_ELEMENTS} elements or "
                f"with no such axis replicated): {_mib(per_device)} per device, {_mib(full)} replicated")

    def put(self, tree: Any, shardings: Any) -> Any:
        """Places a pytree of (host or single-device) arrays with `shardings`, in one process or many
        (every process passes the same values). PRNG keys are placed through their raw data."""
        def put_leaf(x: Any, sharding: NamedSharding) -> jax.Array:
            if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
                return jax.random.wrap_key_data(put_leaf(jax.random.key_data(x), sharding),
                                                impl=jax.random.key_impl(x))
            if isinstance(x, jax.Array) and x.sharding == sharding:
                return x
            host = np.asarray(x)
            return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

        return jax.tree.map(put_leaf, tree, shardings)


def make_layout(mesh: str = "auto", devices: list[jax.Device] | None = None) -> Layout:
    """The layout for a `TrainConfig.mesh` value over `devices` (default: every device of every process).

    A mesh may use the first 1/n of the devices of a single process (`data=1` on 4 devices); a
    job of several processes uses every device.

    Raises:
      ConfigError: a malformed mesh, or one whose size does not divide the number of devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = parse_mesh(mesh) or {"data": len(devices)}
    shape = tuple(sizes.get(axis, 1) for axis in AXES)
    size, n = math.prod(shape), len(devices)
    if n % size or (size != n and jax.process_count() > 1):
        use = "uses every device of every process" if jax.process_count() > 1 else f"divides {n}"
        raise ConfigError(f"{setting('mesh', mesh)} needs {size} devices but there are {n} {devices[0].platform} "
                          f"devices; use a mesh whose size {use}, e.g. {setting('mesh', f'data={n}')}",
                          mesh=mesh, num_devices=n)
    # Devices are ordered by process, so `fsdp` (the inner axis) stays within a host where it can.
    return Layout(Mesh(np.array(devices[:size]).reshape(shape), AXES))


def state_bytes_per_device(layout: Layout, state: Any) -> int:
    """Bytes of `state` (arrays or shapes) that the most loaded device holds under `layout`."""
    total = 0
    for leaf in jax.tree.leaves(state):
        spec = layout.spec(tuple(np.shape(leaf)))
        total += _nbytes(leaf) // math.prod(layout.mesh.shape[a] for a in spec if a is not None)
    return total


def shard_bytes(tree: Any, device: jax.Device | None = None) -> int:
    """Bytes that `device` (default: the first local device) holds of the placed arrays in `tree`,
    read from the arrays' shards."""
    device = device or jax.local_devices()[0]
    total = 0
    for leaf in jax.tree.leaves(tree):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        total += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == device)
    return total


def _nbytes(x: Any) -> int:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return math.prod(np.shape(x)) * 8  # a threefry key is two uint32 words
    return math.prod(np.shape(x)) * np.dtype(x.dtype).itemsize


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"
