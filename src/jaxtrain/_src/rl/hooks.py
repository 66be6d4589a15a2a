"""The hooks that turn `fit` into an AlphaZero loop: an epoch is one iteration.

- `SelfPlay`: at the start of each iteration, B games with the current network and search, in
  one compiled call; their positions go into the run's replay feed.
- `Arena`: at the end of each iteration (every `eval_every`), matches in both seats against a
  uniformly random player, the network as it was at the start of the iteration (the previous
  checkpoint) and, when given, an exact solver; the current network's win (and, where the game
  can draw, draw) rates go into the epoch record as `val_win_<opponent>_<seat>`.

Both derive their keys from the run's seed and the iteration, so a resumed run plays the same
games as an uninterrupted one. With `debug`, they run op by op under `jax.disable_jit()` (Python
loops over moves and simulations, values printable anywhere) instead of as compiled calls.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src.compiling import shapes_of
from jaxtrain._src.hooks.base import Run, RunHook
from jaxtrain._src.rl import arena, clique
from jaxtrain._src.rl.network import Forward
from jaxtrain._src.rl.replay import ReplayFeed
from jaxtrain._src.rl.search import SearchConfig
from jaxtrain._src.rl.selfplay import make_self_play

SELF_PLAY_STREAM, ARENA_STREAM = 1, 2  # fold_in constants: the hooks' keys, apart from training's


def variables_of(run: Run) -> tuple[Any, Any]:
    """The network's variables as `network.make_forward` takes them."""
    return run.state.params, run.state.model_state


def eager(fn: Callable) -> Callable:
    """`fn` run op by op, without jit (the debug mode)."""
    def run(*args: Any) -> Any:
        with jax.disable_jit():
            return fn(*args)

    return run


def can_draw(game: clique.Game) -> bool:
    """False when every colouring of K_n has a monochromatic k-clique (n >= R(k, k))."""
    ramsey = {2: 2, 3: 6, 4: 18}  # R(5,5) is unknown (43..46)
    return game.k not in ramsey or game.n < ramsey[game.k]


class SelfPlay(RunHook):
    """Plays `num_games` games at the start of every iteration into `run.feed` (a `ReplayFeed`)."""

    name = "self_play"

    def __init__(self, game: clique.Game, forward: Forward, search: SearchConfig, num_games: int, seed: int,
                 debug: bool = False):
        self._fn = make_self_play(game, forward, search, num_games)
        self._key = jax.random.fold_in(jax.random.key(seed), SELF_PLAY_STREAM)
        self._num_games, self._debug = num_games, debug
        self._play: Callable[..., Any] | None = None  # compiled in on_start
        self.stats: dict[str, float] = {}

    def on_start(self, run: Run) -> None:
        self._play = eager(self._fn) if self._debug else run.calls.compile(
            self._fn, shapes_of(variables_of(run)), self._key)

    def on_epoch_start(self, run: Run) -> None:
        if run.loop.position:  # resumed inside an iteration: its games are in the restored ring
            return
        t0 = time.perf_counter()
        assert self._play is not None and isinstance(run.feed, ReplayFeed)  # fit made one of the ReplayBuffer
        positions, games = self._play(variables_of(run), jax.random.fold_in(self._key, run.epoch))
        run.feed.add(positions)
        length, winner = jax.device_get(games)
        seconds = time.perf_counter() - t0
        self.stats = {"games": self._num_games, "positions": int(length.sum()), "selfplay_time_s": seconds,
                      "ms_per_game": 1e3 * seconds / self._num_games, "game_length": float(length.mean()),
                      "first_player_wins": float(np.mean(winner == 1)), "draws": float(np.mean(winner == 0))}

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        record.update(self.stats)
        record["epoch_time_s"] = record.get("epoch_time_s", 0.0) + self.stats.get("selfplay_time_s", 0.0)

    def state_dict(self) -> dict[str, Any]:
        return {"stats": self.stats}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats = dict(state.get("stats", {}))


class Arena(RunHook):
    """Evaluates the network with search (no exploration) against opponents, in both seats.

    Args:
      game, forward, search: the game, the network's pure forward function and the search.
      num_games: games per match (one match per opponent and seat).
      seed: the run's seed (the random player's and the searches' keys derive from it).
      every: evaluate every this many iterations (and the last).
      solver: an exact solver as `(player, variables)`, or None.
      debug: play op by op without jit.
    """

    name = "arena"

    def __init__(self, game: clique.Game, forward: Forward, search: SearchConfig, num_games: int, seed: int,
                 every: int = 1, solver: tuple[arena.Player, Any] | None = None, debug: bool = False):
        player: arena.Player | None = solver[0] if solver is not None else None
        self._solver: Any = solver[1] if solver is not None else None  # the solver's variables
        self._fn = arena.make_match(game, forward, search, num_games, player)
        self._opponents = {"random": arena.RANDOM, "previous": arena.PREVIOUS,
                           **({"solver": arena.SOLVER} if solver is not None else {})}
        self._key = jax.random.fold_in(jax.random.key(seed), ARENA_STREAM)
        self._every, self._draws, self._debug = every, can_draw(game), debug
        self._match: Callable[..., Any] | None = None  # compiled in on_start
        self._previous: Any = None

    def on_start(self, run: Run) -> None:
        mine = shapes_of(variables_of(run))
        flag = jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((), bool)
        self._match = eager(self._fn) if self._debug else run.calls.compile(
            self._fn, mine, mine, shapes_of(self._solver), *flag, self._key)

    def on_epoch_start(self, run: Run) -> None:
        if self._previous is None or run.loop.position == 0:  # a copy: the next call donates the state's buffers
            self._previous = jax.tree.map(jnp.copy, variables_of(run))

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        if run.epoch % self._every and run.epoch != run.last_epoch:
            return
        t0 = time.perf_counter()
        assert self._match is not None
        mine, key = variables_of(run), jax.random.fold_in(self._key, run.epoch)
        for name, opponent in self._opponents.items():
            theirs = self._previous if opponent == arena.PREVIOUS else mine
            for seat, first in (("first", True), ("second", False)):
                winner, length = self._match(mine, theirs, self._solver, np.int32(opponent), np.bool_(first),
                                             jax.random.fold_in(key, 2 * opponent + first))
                result = arena.outcome(winner, length, first)
                record[f"val_win_{name}_{seat}"] = result.win
                if self._draws:
                    record[f"val_draw_{name}_{seat}"] = result.draw
        seconds = time.perf_counter() - t0
        record["eval_time_s"] = record.get("eval_time_s", 0.0) + seconds
        record["epoch_time_s"] = record.get("epoch_time_s", 0.0) + seconds
