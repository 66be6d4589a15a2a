"""`jaxtrain bench selfplay`: AlphaZero self-play, plain Python search against one compiled call.

On the clique game at n=6, k=3 (Sim) and n=14, k=4, with the `alphazero` recipe's network
(`PolicyValueMLP(E, 128, 3)`, untrained, seed 0) and `--simulations` (32) simulations per move:

- (0) `python_mcts.play_game`, one game at a time, the nnx model called eagerly on one
  observation per expanded node: the "before";
- (1) the same search with `jax.jit` of the forward (one observation per call);
- (2) `make_self_play` of `--games` (64) games in one compiled call (every move a batched mctx
  search), Gumbel MuZero and MuZero (PUCT with Dirichlet noise) rows; compile time reported apart.

The Python rows use PUCT with the MuZero row's Dirichlet noise (alpha 0.3, fraction 0.25) and
temperature 1, and game i is played with `default_rng(i)` in both rows, so (0) and (1) play the
same games (`--repeats` of them at n=6, one of up to 91 moves at n=14). ms/game is the median over
games (Python) or over `--repeats` calls divided by the games per call (mctx: every call runs E
moves, finished games idle); "vs (0)" is row (0)'s ms/game over the row's. "network" is the share
of the Python game's time spent in network calls.

Training: updates/s of the recipe's train step (loss, symmetry augmentation, AdamW; state donated)
through the engine's own path: a `ReplayBuffer` feed filled with the Gumbel self-play positions,
its fused call of the recipe's `steps_per_call` steps sampling every batch from the ring on the device,
at batch 256 and 512, n=6. Results go to `--out`: results.json and selfplay.png.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rich.console import Console
from rich.table import Table

from jaxtrain._src.errors import ConfigError

if TYPE_CHECKING:  # JAX and NumPy are imported where they run: `jaxtrain bench selfplay --help` needs none
    import numpy as np

SIZES = ((6, 3), (14, 4))  # (n, k): Sim, and the larger game of the case notes
TARGET_MS_PER_GAME = 1.5  # n=6, 64 games in one call, 32 simulations
TARGET_SPEEDUP = 15.0  # over row (0), the plain Python search with an eager network
LARGE_PYTHON_GAMES = 1  # games of the Python rows at n=14 (each is up to 91 moves x simulations calls)
QUICK_MOVES = 3  # quick mode, n=14 Python rows: moves timed, extrapolated to a full board (E moves)
TRAIN_BATCHES = (256, 512)
VARIANTS = {  # key -> label
    "python_eager": "(0) Python MCTS, eager net",
    "python_jit": "(1) Python MCTS, jitted net",
    "mctx_gumbel": "(2) mctx Gumbel, batched",
    "mctx_muzero": "(2) mctx MuZero, batched",
}


@dataclasses.dataclass(frozen=True)
class SelfPlayBenchConfig:
    """Settings of the self-play benchmark."""

    repeats: int = 5
    """Timed compiled calls per mctx row and training batch, and Python games at n=6 (medians reported)."""
    games: int = 64
    """Games played at once in one compiled mctx self-play call."""
    simulations: int = 32
    """Search simulations per move, in every row."""
    out: str = "runs/bench-selfplay"
    """Directory for results.json and selfplay.png."""
    quick: bool = False
    """A tiny run for smoke tests: 4 games, 4 simulations, 2 repeats; n=14 Python rows only, on 3 moves; batch 32."""

    def __post_init__(self) -> None:
        for name in ("repeats", "games", "simulations"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} {getattr(self, name)} must be >= 1")


def _figure(x: float) -> str:
    """`4,012` for large figures, three significant digits for small ones (`1.61`, `0.0431`)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


class _TimedNet:
    """A `python_mcts.Net` that adds up the time spent in its calls."""

    def __init__(self, net: Callable[[np.ndarray], tuple[np.ndarray, float]]):
        self.net, self.seconds, self.calls = net, 0.0, 0

    def __call__(self, observation: np.ndarray) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        out = self.net(observation)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


def _model(game: Any) -> Any:
    """The recipe's network for `game`, as `alphazero.build_model` makes it (seed 0)."""
    from flax import nnx

    from jaxtrain._src.rl.network import PolicyValueMLP
    from jaxtrain.tools.recipes.alphazero import AlphaZeroConfig

    defaults = AlphaZeroConfig()
    return PolicyValueMLP(game.num_edges, defaults.width, defaults.depth, rngs=nnx.Rngs(0))


def _python_nets(model: Any, num_edges: int) -> dict[str, tuple[Callable, float | None]]:
    """variant -> (net on one (E, 2) observation returning host values, compile seconds)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxtrain._src.rl.network import make_forward

    def eager(observation: np.ndarray) -> tuple[np.ndarray, float]:
        logits, value = model(jnp.asarray(observation))  # op by op: one dispatch per layer
        return np.asarray(logits), float(value)

    forward, variables = make_forward(model)
    t0 = time.perf_counter()
    compiled = jax.jit(forward).lower(variables, np.zeros((num_edges, 2), np.float32)).compile()
    compile_s = time.perf_counter() - t0

    def jitted(observation: np.ndarray) -> tuple[np.ndarray, float]:
        logits, value = compiled(variables, observation)
        return np.asarray(logits), float(value)

    return {"python_eager": (eager, None), "python_jit": (jitted, compile_s)}


def _play_moves(game: Any, net: Callable, simulations: int, rng: np.random.Generator, moves: int,
                noise: dict[str, float]) -> int:
    """The first `moves` moves of a `play_game` (temperature 1); returns the moves played."""
    from benchmarks import python_mcts

    colours, to_play = [0] * game.num_edges, 1
    for played in range(1, moves + 1):
        visits = python_mcts.search(game, colours, to_play, net, simulations, rng, **noise)
        action = int(rng.choice(game.num_edges, p=visits / visits.sum()))
        colours[action] = to_play
        if python_mcts.completes_clique(game, colours, action, to_play) or played == game.num_edges:
            return played
        to_play = -to_play
    return moves


def _python_row(game: Any, net: Callable, simulations: int, games: int, moves: int | None) -> dict[str, Any]:
    """Times `games` Python games (or their first `moves` moves, extrapolated to a full board of E moves)."""
    import numpy as np

    from benchmarks import python_mcts
    from jaxtrain._src.rl.search import SearchConfig

    search = SearchConfig(simulations=simulations, policy="muzero")
    noise = {"dirichlet_alpha": search.dirichlet_alpha, "dirichlet_fraction": search.dirichlet_fraction}
    times, lengths, net_s = [], [], 0.0
    for i in range(games):
        timed = _TimedNet(net)
        rng = np.random.default_rng(i)  # game i is the same game in every Python row
        t0 = time.perf_counter()
        if moves is None:
            length = len(python_mcts.play_game(game, timed, simulations, rng, **noise).actions)
        else:
            length = _play_moves(game, timed, simulations, rng, moves, noise)
        seconds = time.perf_counter() - t0
        times.append(seconds if moves is None else seconds / length * game.num_edges)
        lengths.append(length)
        net_s += timed.seconds / seconds
    how = (f"median of {games} games" if games > 1 else "1 game") if moves is None else \
        f"{lengths[0]} moves x {game.num_edges}/{lengths[0]} (extrapolated)"
    return {"ms_per_game": statistics.median(times) * 1e3, "games_timed": games, "network_share": net_s / games,
            "moves_per_game": float(np.mean(lengths)) if moves is None else float(game.num_edges), "how": how}


def _mctx_row(game: Any, model: Any, simulations: int, policy: str, games: int, repeats: int
              ) -> tuple[dict[str, Any], list[Any]]:
    """Times `repeats` compiled calls of `games` self-play games; also returns every call's positions."""
    import jax
    import numpy as np

    from jaxtrain._src.rl.network import make_forward
    from jaxtrain._src.rl.search import SearchConfig
    from jaxtrain._src.rl.selfplay import make_self_play

    forward, variables = make_forward(model)
    self_play = make_self_play(game, forward, SearchConfig(simulations=simulations, policy=policy), games)
    t0 = time.perf_counter()
    compiled = jax.jit(self_play).lower(variables, jax.random.key(0)).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(variables, jax.random.key(0)))  # warm-up
    times, lengths, positions = [], [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        out, stats = jax.block_until_ready(compiled(variables, jax.random.key(i + 1)))
        times.append(time.perf_counter() - t0)
        lengths.append(float(stats.length.mean()))
        positions.append(out)
    row = {"ms_per_game": statistics.median(times) / games * 1e3, "games_timed": games * repeats,
           "moves_per_game": float(np.mean(lengths)), "compile_s": compile_s, "network_share": None,
           "how": f"median of {repeats} calls"}
    return row, positions


def _training_row(game: Any, positions: list[Any], batch_size: int, steps_per_call: int, repeats: int
                  ) -> dict[str, Any]:
    """Updates/s of the recipe's train step in the replay feed's fused call, as `fit` compiles it."""
    import jax
    import numpy as np

    from jaxtrain._src.program import build_program
    from jaxtrain._src.rl.network import alphazero_loss, make_symmetry_augment
    from jaxtrain._src.rl.replay import ReplayBuffer
    from jaxtrain._src.sharding import make_layout
    from jaxtrain.tools.recipes.alphazero import AlphaZeroConfig, build_model

    config = AlphaZeroConfig(vertices=game.n, k=game.k, batch_size=batch_size, steps_per_epoch=steps_per_call,
                             steps_per_call=steps_per_call, log_every=steps_per_call)
    program = build_program(build_model(config), alphazero_loss, config,
                            train_data=ReplayBuffer(config.replay_size, game.num_edges),
                            augment=make_symmetry_augment(game), total_steps=steps_per_call * (repeats + 1),
                            layout=make_layout("data=1"))
    feed, state = program.feed, program.state
    for batch in positions:
        feed.add(batch)
    calls = program.calls(steps_per_call, form="scan")  # the fused call: (state, *args, first step, steps)
    compiled = calls.get(steps_per_call)
    compile_s = calls.compile_s
    first, valid = np.int32(0), np.int32(steps_per_call)
    state, metrics = jax.block_until_ready(compiled(state, *feed.next_args(steps_per_call), first, valid))  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, metrics = jax.block_until_ready(compiled(state, *feed.next_args(steps_per_call), first, valid))
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    return {"n": game.n, "k": game.k, "batch": batch_size, "steps_per_call": steps_per_call,
            "updates_per_s": steps_per_call / seconds, "samples_per_s": steps_per_call * batch_size / seconds,
            "ms_per_update": seconds / steps_per_call * 1e3, "compile_s": compile_s,
            "replay_positions": int(feed.ring.size), "loss": float(metrics["loss"][-1])}


def measure(config: SelfPlayBenchConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(self-play rows, training rows), as `main` prints them."""
    from jaxtrain._src.rl import clique

    games, simulations, repeats = (4, 4, 2) if config.quick else (config.games, config.simulations, config.repeats)
    rows, train_rows, sim_positions = [], [], []
    for n, k in SIZES:
        game = clique.Game(n, k)
        model = _model(game)
        large = (n, k) != SIZES[0]
        measured: dict[str, dict[str, Any]] = {}
        for variant, (net, compile_s) in _python_nets(model, game.num_edges).items():
            row = _python_row(game, net, simulations, LARGE_PYTHON_GAMES if large else repeats,
                              QUICK_MOVES if config.quick and large else None)
            measured[variant] = {**row, "compile_s": compile_s}
        for policy in () if config.quick and large else ("gumbel", "muzero"):  # quick: compile n=6's only
            measured[f"mctx_{policy}"], positions = _mctx_row(game, model, simulations, policy, games, repeats)
            if not large and policy == "gumbel":
                sim_positions = positions
        before = measured["python_eager"]["ms_per_game"]
        for variant, label in VARIANTS.items():
            if variant not in measured:
                continue
            row = measured[variant]
            rows.append({"n": n, "k": k, "variant": variant, "label": label, "simulations": simulations,
                         "games_per_call": games if variant.startswith("mctx") else 1, **row,
                         "games_per_s": 1e3 / row["ms_per_game"], "ms_per_move": row["ms_per_game"] / row[
                             "moves_per_game"], "speedup": before / row["ms_per_game"]})
    n, k = SIZES[0]
    batches, steps_per_call = ((32,), 4) if config.quick else (TRAIN_BATCHES, _recipe_steps_per_call())
    for batch_size in batches:
        train_rows.append(_training_row(clique.Game(n, k), sim_positions, batch_size, steps_per_call, repeats))
    return rows, train_rows


def _recipe_steps_per_call() -> int:
    from jaxtrain.tools.recipes.alphazero import AlphaZeroConfig

    return AlphaZeroConfig().steps_per_call


def targets(config: SelfPlayBenchConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets on the n=6 Gumbel row; `met` is None when the run used other settings."""
    row = next(r for r in rows if r["n"] == SIZES[0][0] and r["variant"] == "mctx_gumbel")
    applies = not config.quick and config.games == 64 and config.simulations == 32
    return {
        "ms_per_game": {"target": TARGET_MS_PER_GAME, "measured": row["ms_per_game"],
                        "met": row["ms_per_game"] <= TARGET_MS_PER_GAME if applies else None},
        "speedup_vs_python": {"target": TARGET_SPEEDUP, "measured": row["speedup"],
                              "met": row["speedup"] >= TARGET_SPEEDUP if applies else None},
    }


def _chart(rows: list[dict[str, Any]], path: Path) -> Path:
    """Bars of ms per game (log scale), one group per game size, one bar per variant."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxtrain._src.report.plots import save_figure

    sizes = list(dict.fromkeys((r["n"], r["k"]) for r in rows))
    colours = ("#c44e52", "#dd8452", "#4c72b0", "#55a868")
    width = 0.8 / len(VARIANTS)
    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    for i, (variant, label) in enumerate(VARIANTS.items()):
        mine = [r for size in sizes for r in rows if (r["n"], r["k"]) == size and r["variant"] == variant]
        x = np.array([sizes.index((r["n"], r["k"])) for r in mine]) + (i - (len(VARIANTS) - 1) / 2) * width
        bars = ax.bar(x, [r["ms_per_game"] for r in mine], width, label=label, color=colours[i])
        for bar, r in zip(bars, mine):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), _figure(r["ms_per_game"]), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(np.arange(len(sizes)), [f"n={n}, k={k}" for n, k in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("ms per game of self-play (log)")
    ax.set_title(f"AlphaZero self-play, {rows[0]['simulations']} simulations per move")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, make_parent=True)


def main(config: SelfPlayBenchConfig) -> int:
    import jax

    from jaxtrain._src.report import device_description

    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 170  # a file or pipe: one line per row
    device = device_description(jax.devices()[0])
    rows, train_rows = measure(config)
    simulations = rows[0]["simulations"]
    table = Table(title=f"AlphaZero self-play, {simulations} simulations per move, recipe network (128 x 3), "
                        f"{device}{' (quick)' if config.quick else ''}")
    for column in ("game", "variant", "games/call", "moves/game", "ms/game", "games/s", "ms/move", "vs (0)",
                   "network", "compile s", "timed"):
        table.add_column(column, justify="left" if column in ("game", "variant", "timed") else "right",
                         no_wrap=column in ("game", "variant"))
    for previous, r in zip([None, *rows], rows):
        if previous is not None and previous["n"] != r["n"]:
            table.add_section()
        share = r["network_share"]
        table.add_row(f"n={r['n']}, k={r['k']}", r["label"], str(r["games_per_call"]), f"{r['moves_per_game']:.1f}",
                      _figure(r["ms_per_game"]), _figure(r["games_per_s"]), _figure(r["ms_per_move"]),
                      f"{r['speedup']:.1f}x", "-" if share is None else f"{share:.0%}",
                      "-" if r["compile_s"] is None else f"{r['compile_s']:.2f}", r["how"])
    console.print(table)

    train = Table(title=f"AlphaZero training updates (recipe train step, replay feed's fused call), {device}")
    for column in ("game", "batch", "steps/call", "updates/s", "ms/update", "samples/s", "compile s"):
        train.add_column(column, justify="left" if column == "game" else "right")
    for r in train_rows:
        train.add_row(f"n={r['n']}, k={r['k']}", str(r["batch"]), str(r["steps_per_call"]),
                      f"{r['updates_per_s']:,.1f}", f"{r['ms_per_update']:.2f}", f"{r['samples_per_s']:,.0f}",
                      f"{r['compile_s']:.2f}")
    console.print(train)

    goals = targets(config, rows)
    for name, what, unit in (("ms_per_game", "<=", " ms/game"), ("speedup_vs_python", ">=", "x row (0)")):
        goal = goals[name]
        verdict = {True: "met", False: "NOT met", None: "not judged (needs --games 64 --simulations 32, not quick)"}
        console.print(f"target n={SIZES[0][0]}, mctx Gumbel: {what} {goal['target']:g}{unit}: measured "
                      f"{goal['measured']:.3g}{unit}, {verdict[goal['met']]}")
    console.print("ms/game: median wall time per game, compile excluded; mctx calls run all E moves for every game "
                  "(finished games idle), divided by games/call. vs (0): row (0)'s ms/game over the row's. network: "
                  "share of a Python game's time in network calls. Python rows: PUCT with Dirichlet noise, game i "
                  "seeded i in both rows.")

    out = Path(config.out)
    payload = {"config": dataclasses.asdict(config), "device": device, "jax_version": jax.__version__,
               "date": time.strftime("%Y-%m-%d %H:%M"), "selfplay": rows, "training": train_rows, "targets": goals}
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    except OSError as e:
        raise ConfigError(f"cannot write {out / 'results.json'}: {e.strerror or e}; choose another --out") from None
    chart = _chart(rows, out / "selfplay.png")
    console.print(f"wrote {out / 'results.json'}, {chart}")
    return 0
