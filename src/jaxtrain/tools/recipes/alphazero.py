"""`alphazero`: AlphaZero self-play on the clique game (Sim by default), all on the device.

Each iteration (an epoch of `fit`) plays `game_batch_size` games at once in one compiled call
(every move a batched mctx search, Gumbel MuZero by default), adds their positions to a replay
ring on the device, takes `steps_per_epoch` optimizer steps on batches sampled from it (fused as
any recipe's steps), and plays evaluation matches against a random player, the previous
network and, for Sim, an exact solver. The engine's checkpoints hold the ring too, so `--resume`
continues exactly.

The flags of the trainer this workload comes from, in this project's spelling:
`jaxtrain train alphazero --vertices 6 --k 3 --num-episodes 1000 --training-batch-size 256
--game-batch-size 64 --simulations 32 --policy gumbel`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Literal

from jaxtrain import CheckpointConfig, ConfigError, OptimConfig
from jaxtrain.tools.recipes.base import Recipe, RecipeConfig, Workload

if TYPE_CHECKING:  # JAX is imported by the functions that use it: the config and --help need none
    from flax import nnx

# jaxtrain.rl (and mctx) are imported when the recipe is built: other recipes do not pay for them.

MAX_VERTICES = 20  # E = 190 edges; the clique tables and boards grow as C(n, k) and n^2
MAX_SOLVED_EDGES = 15  # the exact solver's table has 3^E entries: Sim (n = 6) and smaller


@dataclasses.dataclass(frozen=True)
class AlphaZeroConfig(RecipeConfig):
    """alphazero: Sim (n=6, k=3) by self-play with 32-simulation Gumbel MuZero search, 128 iterations of 64 games."""

    vertices: int = 6
    """n: vertices of the complete graph whose edges the players colour."""
    k: int = 3
    """A player who completes a k-clique in their own colour loses (3 <= k <= n)."""
    num_episodes: int = 0
    """Self-play games in all: sets --epochs to ceil(num_episodes / game_batch_size) iterations; 0: use --epochs."""
    game_batch_size: int = 64
    """Games played at once in each iteration's compiled self-play call."""
    simulations: int = 32
    """Search simulations per move, in self-play and evaluation."""
    policy: Literal["gumbel", "muzero"] = "gumbel"
    """gumbel: Gumbel MuZero search (improved-policy targets); muzero: PUCT with Dirichlet noise (visit counts)."""
    replay_size: int = 32_768
    """Positions the replay ring on the device holds (the oldest are overwritten)."""
    eval_games: int = 64
    """Games per evaluation match (one match per opponent and seat)."""
    solver: bool = True
    """Evaluate against the exact solver when the game is small enough to solve (n = 6)."""
    width: int = 128
    """Hidden width of the policy/value network."""
    depth: int = 3
    """Hidden layers of the policy/value network."""
    symmetries: bool = True
    """Train on each position under a random relabelling of the vertices (the game's symmetries)."""
    debug: bool = False
    """Run self-play and evaluation op by op without jit (for debugging; same results on a fixed seed, slower)."""

    epochs: int = 128
    """Iterations, each self-play of game_batch_size games, training, evaluation (--num-episodes sets it)."""
    batch_size: int = 256
    """Positions per optimizer step (--training-batch-size is the same flag)."""
    steps_per_epoch: int = 64
    """Optimizer steps per iteration, on batches sampled from the replay ring."""
    steps_per_call: int = 64
    """Optimizer steps fused into one compiled call."""
    eval_every: int = 8
    """Evaluation matches every this many iterations (and after the last)."""
    log_every: int = 64
    """Steps between logged training-metric rows."""
    optim: OptimConfig = OptimConfig(name="adamw", lr=1e-3, weight_decay=1e-4)
    """Optimizer settings."""
    checkpoint: CheckpointConfig = CheckpointConfig(keep_best=0)
    """Checkpoint settings (each iteration's end; the replay ring is included)."""

    def __post_init__(self) -> None:
        n, k = self.vertices, self.k
        if not 3 <= n <= MAX_VERTICES:
            raise ConfigError(f"--vertices {n} must be between 3 and {MAX_VERTICES}")
        if not 3 <= k <= n:
            raise ConfigError(f"--k {k} must be between 3 and --vertices ({n})")
        for flag, value in (("--game-batch-size", self.game_batch_size),
                            ("--simulations", self.simulations), ("--replay-size", self.replay_size),
                            ("--eval-games", self.eval_games), ("--width", self.width), ("--depth", self.depth),
                            ("--training-batch-size", self.batch_size)):
            if value < 1:
                raise ConfigError(f"{flag} {value} must be >= 1")
        if self.num_episodes < 0:
            raise ConfigError(f"--num-episodes {self.num_episodes} must be >= 1 (or 0: use --epochs)")
        if self.num_episodes:  # frozen: set before TrainConfig checks it
            object.__setattr__(self, "epochs", math.ceil(self.num_episodes / self.game_batch_size))
        if self.remat != "none":
            raise ConfigError(f"--remat {self.remat}: the alphazero network has no blocks worth recomputing")
        super().__post_init__()


def build_model(config: AlphaZeroConfig, info: dict | None = None) -> nnx.Module:
    from jaxtrain.models import compiled_init
    from jaxtrain.rl import Game, PolicyValueMLP

    game = Game(config.vertices, config.k)
    return compiled_init(lambda rngs: PolicyValueMLP(game.num_edges, config.width, config.depth, rngs=rngs),
                         config.seed)


def solver_for(game: Any) -> Any:
    """The exact solver as an arena opponent `(player, variables)`, or None when the game is too big."""
    if game.num_edges > MAX_SOLVED_EDGES:
        return None
    from jaxtrain.engine import solver_player

    return solver_player(game)


def build(config: AlphaZeroConfig) -> Workload:
    from jaxtrain.rl import (
        Arena,
        Game,
        ReplayBuffer,
        SearchConfig,
        SelfPlay,
        alphazero_loss,
        make_forward,
        make_symmetry_augment,
    )

    game = Game(config.vertices, config.k)
    model = build_model(config)
    forward, _ = make_forward(model)
    search = SearchConfig(simulations=config.simulations, policy=config.policy)
    hooks = (
        SelfPlay(game, forward, search, config.game_batch_size, config.seed, debug=config.debug),
        Arena(game, forward, search, config.eval_games, config.seed, every=config.eval_every,
              solver=solver_for(game) if config.solver else None, debug=config.debug),
    )
    return Workload(model=model, loss_fn=alphazero_loss, train=ReplayBuffer(config.replay_size, game.num_edges),
                    val=None, augment=make_symmetry_augment(game) if config.symmetries else None, hooks=hooks,
                    info={"vertices": config.vertices, "k": config.k})


RECIPE = Recipe(
    name="alphazero",
    description="AlphaZero self-play with mctx on the clique game (Sim: n=6, k=3), on the device end to end",
    config=AlphaZeroConfig(),
    build=build,
    model=build_model,
    aliases={"--training-batch-size": "--batch-size"},
)
