"""`jaxtrain bench gpu` (benchmarks/gpu.sh) cannot rot between GPU leases: the full-size commands of every
part parse as the commands they call, and the parts that have no quick test of their own (the nanoGPT run
and the populations) run at toy sizes to their JSON and table. (zoo, precision and attention run --quick in
their own tests.)"""

import json
import shlex

import pytest

from benchmarks import BENCHMARKS, benchmark
from benchmarks.gpu import NANOGPT, PARTS, ZOO_MODELS, GpuBenchConfig, commands, main
from jaxtrain import ConfigError
from jaxtrain.tools import cli


def test_the_full_size_commands_are_valid(tmp_path):
    from benchmarks.zoo import ZOO
    from jaxtrain.tools.recipes import get_recipe

    for part in PARTS:
        for command in commands(part, tiny=False, out=tmp_path):
            if command[1:4] == ["-m", "jaxtrain", "bench"]:
                name, args = command[4], command[5:]
                config_cls, _ = benchmark(name)
                cli.parse_config(config_cls, config_cls(), args, f"jaxtrain bench {name}")  # raises on a bad flag
    assert set(ZOO_MODELS.split(",")) <= set(ZOO)
    recipe = get_recipe("char-gpt")
    config = cli.parse_config(type(recipe.config), recipe.config, NANOGPT, "jaxtrain train char-gpt")
    # nanoGPT's config/train_shakespeare_char.py
    assert (config.model.n_layer, config.model.n_head, config.model.n_embd, config.model.block_size) == (6, 6, 384, 256)
    assert (config.batch_size, config.model.dropout, config.epochs * config.steps_per_epoch) == (64, 0.2, 5000)
    assert (config.optim.lr, config.optim.min_lr, config.optim.b2, config.optim.warmup_steps) == (1e-3, 1e-4, 0.99, 100)
    assert "gpu" in BENCHMARKS
    population, = commands("population", tiny=False, out=tmp_path)
    assert population[2:4] == ["16", "64"] and "lone,vmap" in shlex.join(population)


def test_an_unknown_part_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="unknown part 'gp'"):
        main(GpuBenchConfig(parts="gp", out=str(tmp_path)))


@pytest.mark.slow  # two child processes
def test_tiny_gpt_and_population_write_the_json_and_table(tmp_path, capsys):
    assert main(GpuBenchConfig(parts="gpt,population", tiny=True, out=str(tmp_path))) == 0
    report = json.loads((tmp_path / "gpu.json").read_text())
    gpt, population = report["parts"]
    assert gpt["status"] == population["status"] == "ok" and report["tiny"]
    assert 0 < gpt["best_val_loss"] < 10 and gpt["steps"] == 4 and not gpt["met"]  # 4 toy steps: far from 1.47
    assert any("vmap" in line and "member-steps/s" in line for line in population["table"])
    table = (tmp_path / "gpu.md").read_text()
    assert "| gpt | ok |" in table and "| population | ok |" in table
    assert "GPU proof on" in capsys.readouterr().out
