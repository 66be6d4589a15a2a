"""`gnn`: the GraphNet of Flax's ogbg-molpcba example, on padded dense arrays (no jraph).

Source: google/flax `examples/ogbg_molpcba/models.py` (GraphNet, MLP), `train.py` (masked binary
cross-entropy over 128 tasks whose missing labels are NaN, globals replaced by ones, Adam 1e-3) and
`configs/default_graph_net.py` (edge model, skip connections, LayerNorm, dropout 0.1, 1-layer MLPs).
Nodes, edges and globals are embedded by Dense layers; each message-passing step is
jraph's GraphNetwork written out: edges ← MLP([edges, sender nodes, receiver nodes, globals]),
nodes ← MLP([nodes, sum of outgoing edges, sum of incoming edges, globals]), globals ←
MLP([sum of nodes, sum of edges, globals]), each plus its input, then LayerNorm; a Dense decodes the
globals to 128 logits. Dropout layers hold RNG streams. `jax.jit` step, as the example.

Layout: jraph concatenates a batch's graphs and pads the batch; here each graph is one row padded
to 32 nodes and 100 edges (after the example's undirected edges and self-loops), with `senders` /
`receivers` indexing that graph's nodes and masks marking real nodes and edges, so a row is a
sample jaxtrain can batch. Shrunk: latent 32 (256), 3 message-passing steps (5), batch 128 (256); no
virtual node.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import TASK_SEED, Batch, ZooModel

SOURCE = "google/flax examples/ogbg_molpcba/models.py (GraphNet) + train.py + configs/default_graph_net.py"
MAX_NODES, MAX_EDGES = 32, 100
NODE_FEATURES, EDGE_FEATURES, NUM_TASKS = 9, 3, 128  # OGB's atom and bond features, molpcba's tasks


class MLP(nnx.Module):
    """Dense → relu → Dropout, for each size in `feature_sizes`."""

    def __init__(self, in_features: int, feature_sizes: list[int], dropout_rate: float, *, rngs: nnx.Rngs):
        sizes = [in_features, *feature_sizes]
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:])])
        self.dropouts = nnx.List([nnx.Dropout(dropout_rate, rngs=rngs) for _ in feature_sizes])

    def __call__(self, x: jax.Array) -> jax.Array:
        for dense, dropout in zip(self.layers, self.dropouts):
            x = dropout(nnx.relu(dense(x)))
        return x


def _gather(nodes: jax.Array, index: jax.Array) -> jax.Array:
    """nodes (B, N, L), index (B, E) -> (B, E, L): each edge's endpoint features."""
    return jnp.take_along_axis(nodes, index[..., None], axis=1)


def _scatter_sum(edges: jax.Array, index: jax.Array, num_nodes: int) -> jax.Array:
    """edges (B, E, L) summed into their nodes: (B, N, L) (jraph's segment_sum, graph by graph)."""
    return jax.vmap(lambda e, i: jax.ops.segment_sum(e, i, num_nodes))(edges, index)


class GraphNet(nnx.Module):
    """A padded graph batch -> logits (B, output_globals_size) decoded from the globals."""

    def __init__(self, latent_size: int, num_mlp_layers: int, message_passing_steps: int,
                 output_globals_size: int, dropout_rate: float = 0.0, *, rngs: nnx.Rngs):
        L = latent_size
        self.embed_node = nnx.Linear(NODE_FEATURES, L, rngs=rngs)
        self.embed_edge = nnx.Linear(EDGE_FEATURES, L, rngs=rngs)
        self.embed_global = nnx.Linear(1, L, rngs=rngs)
        sizes = [L] * num_mlp_layers
        self.edge_mlps = nnx.List([MLP(4 * L, sizes, dropout_rate, rngs=rngs) for _ in range(message_passing_steps)])
        self.node_mlps = nnx.List([MLP(4 * L, sizes, dropout_rate, rngs=rngs) for _ in range(message_passing_steps)])
        self.global_mlps = nnx.List([MLP(3 * L, sizes, dropout_rate, rngs=rngs) for _ in range(message_passing_steps)])
        self.norms = nnx.List([nnx.List([nnx.LayerNorm(L, rngs=rngs) for _ in range(3)])
                               for _ in range(message_passing_steps)])
        self.decoder = nnx.Linear(L, output_globals_size, rngs=rngs)

    def __call__(self, graphs: Batch) -> jax.Array:
        senders, receivers = graphs["senders"], graphs["receivers"]  # (B, E) indices into the graph's nodes
        node_mask = graphs["node_mask"][..., None].astype(jnp.float32)  # (B, N, 1)
        edge_mask = graphs["edge_mask"][..., None].astype(jnp.float32)  # (B, E, 1)
        B, N, _ = graphs["nodes"].shape
        E = senders.shape[1]
        globals_ = jnp.ones((B, 1))  # train.py's replace_globals
        nodes = self.embed_node(graphs["nodes"])  # (B, N, L)
        edges = self.embed_edge(graphs["edges"])  # (B, E, L)
        globals_ = self.embed_global(globals_)  # (B, L)
        L = globals_.shape[-1]
        for edge_mlp, node_mlp, global_mlp, norms in zip(self.edge_mlps, self.node_mlps, self.global_mlps, self.norms):
            new_edges = edge_mlp(jnp.concatenate(
                [edges, _gather(nodes, senders), _gather(nodes, receivers),
                 jnp.broadcast_to(globals_[:, None], (B, E, L))], axis=-1))  # (B, E, L)
            real_edges = new_edges * edge_mask  # padding edges send nothing
            new_nodes = node_mlp(jnp.concatenate(
                [nodes, _scatter_sum(real_edges, senders, N), _scatter_sum(real_edges, receivers, N),
                 jnp.broadcast_to(globals_[:, None], (B, N, L))], axis=-1))  # (B, N, L)
            new_globals = global_mlp(jnp.concatenate(
                [jnp.sum(new_nodes * node_mask, axis=1), jnp.sum(real_edges, axis=1), globals_], axis=-1))  # (B, L)
            # skip connections, then LayerNorm on each of nodes, edges and globals
            nodes = norms[0](new_nodes + nodes)
            edges = norms[1](new_edges + edges)
            globals_ = norms[2](new_globals + globals_)
        return self.decoder(globals_)  # (B, tasks)


def binary_cross_entropy_with_mask(*, logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
    """Elementwise stable BCE; masked labels set to -1 first so NaNs never reach the gradient."""
    labels = jnp.where(mask, labels, -1)
    positive_logits = logits >= 0
    relu_logits = jnp.where(positive_logits, logits, 0)
    abs_logits = jnp.where(positive_logits, logits, -logits)
    return relu_logits - (logits * labels) + (jnp.log(1 + jnp.exp(-abs_logits)))


def loss_fn(model: GraphNet, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean BCE over the labelled (graph, task) pairs; also their accuracy."""
    labels = batch["labels"]  # (B, tasks), NaN where a molecule has no label for a task
    logits = model(batch)
    mask = ~jnp.isnan(labels)
    loss = binary_cross_entropy_with_mask(logits=logits, labels=labels, mask=mask)
    mean_loss = jnp.sum(jnp.where(mask, loss, 0)) / jnp.sum(mask)
    accuracy = jnp.sum(jnp.where(mask, (logits > 0) == (labels > 0.5), False)) / jnp.sum(mask)
    return mean_loss, {"accuracy": accuracy}


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """Random molecule-like graphs (a tree plus a few ring bonds, 8-32 atoms), padded per graph.

    Each bond appears in both directions and every node has a self-loop (zero edge features), as the
    example's pipeline adds. Labels: 128 tasks, each the sign of a fixed projection of the mean atom
    features, with 70% of them NaN (molpcba is sparsely labelled).
    """
    rng = np.random.default_rng(seed)
    projection = np.random.default_rng(TASK_SEED).normal(size=(NODE_FEATURES, NUM_TASKS))
    out = {
        "nodes": np.zeros((n, MAX_NODES, NODE_FEATURES), np.float32),
        "edges": np.zeros((n, MAX_EDGES, EDGE_FEATURES), np.float32),
        "senders": np.zeros((n, MAX_EDGES), np.int32),
        "receivers": np.zeros((n, MAX_EDGES), np.int32),
        "node_mask": np.zeros((n, MAX_NODES), bool),
        "edge_mask": np.zeros((n, MAX_EDGES), bool),
        "labels": np.full((n, NUM_TASKS), np.nan, np.float32),
    }
    for g in range(n):
        num_nodes = int(rng.integers(8, MAX_NODES + 1))
        bonds = [(int(rng.integers(0, i)), i) for i in range(1, num_nodes)]  # a random tree
        bonds += [tuple(rng.choice(num_nodes, 2, replace=False)) for _ in range(int(rng.integers(0, 3)))]
        bond_features = rng.integers(0, 4, size=(len(bonds), EDGE_FEATURES)).astype(np.float32)
        senders = [s for s, r in bonds] + [r for s, r in bonds] + list(range(num_nodes))
        receivers = [r for s, r in bonds] + [s for s, r in bonds] + list(range(num_nodes))
        num_edges = len(senders)  # <= 2 * (num_nodes + 1) + num_nodes <= MAX_EDGES
        atoms = rng.integers(0, 10, size=(num_nodes, NODE_FEATURES)).astype(np.float32)
        out["nodes"][g, :num_nodes] = atoms
        out["edges"][g, :2 * len(bonds)] = np.concatenate([bond_features, bond_features])
        out["senders"][g, :num_edges] = senders
        out["receivers"][g, :num_edges] = receivers
        out["node_mask"][g, :num_nodes] = True
        out["edge_mask"][g, :num_edges] = True
        score = (atoms.mean(0) - 4.5) @ projection  # (tasks,)
        labelled = rng.uniform(size=NUM_TASKS) < 0.3
        out["labels"][g, labelled] = (score[labelled] > 0).astype(np.float32)
    return out


MODEL = ZooModel(
    name="gnn",
    source=SOURCE,
    make_model=lambda seed: GraphNet(latent_size=32, num_mlp_layers=1, message_passing_steps=3,
                                     output_globals_size=NUM_TASKS, dropout_rate=0.1, rngs=nnx.Rngs(seed)),
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=lambda: optax.adam(1e-3),
    batch_size=128,
    hand_jit="jit",
)
