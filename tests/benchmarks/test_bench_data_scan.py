"""Benchmarks of workloads run in quick mode: data (HDF5 streaming vs device-resident) and scan; and
scan-corpus on a corpus of one file.

(Apart from the frameworks benchmark in tests/benchmarks/test_bench_workloads.py, so that
`pytest -n 2 --dist loadfile` spreads the slow quick runs over both workers.)"""

import json
from pathlib import Path

import pytest


@pytest.mark.slow
def test_data_benchmark_quick(tmp_path, capsys):
    from benchmarks.data import DataBenchConfig, main

    assert main(DataBenchConfig(quick=True, dir=str(tmp_path), parts=("hdf5",))) == 0
    from jaxtrain.tools.recipes import get_recipe

    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["runs"]) == {"device (small file in memory)", "stream (large file)", "stream (small file)"}
    trained = results["config"]["steps"] * get_recipe("mlp-regression").config.batch_size  # samples per run
    for runs in results["runs"].values():
        assert runs[0]["samples_per_s"] * runs[0]["train_time_s"] == pytest.approx(trained, rel=1e-9)
        assert 100 < runs[0]["peak_rss_mib"] < 16_384  # MiB of a process that imported JAX (a unit check)
    assert results["runs"]["device (small file in memory)"][0]["input_wait_fraction"] is None  # nothing streamed
    for name in ("stream (large file)", "stream (small file)"):  # waited for the first batch, and trained too
        assert 0 < results["runs"][name][0]["input_wait_fraction"] < 1
    median = {name: runs[0] for name, runs in results["runs"].items()}  # one repeat: the median is the run
    assert results["summary"]["stream_vs_device"] == pytest.approx(
        median["stream (large file)"]["samples_per_s"] / median["device (small file in memory)"]["samples_per_s"])
    assert results["inspect"]["rows_sampled"] == results["config"]["rows"]  # the whole 40,000-row file
    assert set(results["generate_rows_per_s"]) == {"small", "large"} and not list(tmp_path.glob("*.h5"))  # removed


@pytest.mark.slow
def test_data_benchmark_adapters_agreement_and_shards_quick(tmp_path, capsys):
    from benchmarks.data import DataBenchConfig, main

    config = DataBenchConfig(quick=True, dir=str(tmp_path), parts=("adapters", "agreement", "shards"),
                             adapter_kinds=("generator",))
    assert main(config) == 0
    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "results.json").read_text())
    runs, summary = results["adapters"]["runs"], results["adapters"]["summary"]["generator"]
    assert set(runs) == {"arrays", "generator", "generator alone"}
    rate = {k: v[0]["samples_per_s"] for k, v in runs.items()}
    assert summary["vs_arrays"] == pytest.approx(rate["generator"] / rate["arrays"])
    assert all(0 < r[0]["cpu_s_per_sample"] < 1 for r in runs.values())  # seconds of CPU per sample: a unit check
    agreement = results["agreement"]
    for kind in ("torch-dataset", "hf-dataset", "grain-mapdataset"):  # jaxtrain's order: the arrays' result
        assert agreement[kind] == agreement["arrays"]
    assert len(agreement["arrays over seeds"]) == 3
    peaks = {k: v[0]["peak_rss_mib"] for k, v in results["shards"]["runs"].items()}
    assert results["shards"]["rss_10x_vs_1x"] == pytest.approx(peaks["10x budget"] / peaks["1x budget"])
    assert "shared-cores bound" in printed and "npy shards streamed, peak RSS" in printed
    assert not list(tmp_path.glob("shards-*")) and not (tmp_path / "adapter-shards").exists()  # removed


@pytest.mark.slow
def test_data_benchmark_stream_quick(tmp_path, capsys):
    from benchmarks.data import DataBenchConfig, main
    from jaxtrain._src.errors import ConfigError

    assert main(DataBenchConfig(quick=True, dir=str(tmp_path), parts=("stream",))) == 0
    stream = json.loads((tmp_path / "results.json").read_text())["stream"]
    names = {fmt: [f"{fmt} {rows:,} rows" for rows in (6_000, 12_000)] for fmt in ("hdf5", "npy")}
    assert set(stream["runs"]) == {name for pair in names.values() for name in pair}
    for runs in stream["runs"].values():  # whole `jaxtrain train` processes, one each (one repeat)
        assert 100 < runs[0]["peak_rss_mib"] < 16_384 and runs[0]["steps_per_call"] >= 1
        assert 0 <= runs[0]["input_wait_fraction"] < 1
    for fmt, (small, large) in names.items():
        rss = {name: stream["runs"][name][0]["peak_rss_mib"] for name in (small, large)}
        assert stream["ratio"][fmt] == pytest.approx(rss[large] / rss[small])
    assert "<= 1.1x" in capsys.readouterr().out  # the table, its target column
    assert not list(tmp_path.glob("stream-*"))  # the files and the runs' directories removed
    with pytest.raises(ConfigError, match="give two sizes or more"):
        main(DataBenchConfig(dir=str(tmp_path), parts=("stream",), stream_rows=(200_000,)))


@pytest.mark.slow
def test_scan_benchmark_quick(capsys):
    from benchmarks.scan import ScanBenchConfig, main

    assert main(ScanBenchConfig(quick=True)) == 0
    out = capsys.readouterr().out
    assert "lax.conv" in out and "im2col" in out and "char-gpt" in out and out.count("x │") == 3


def test_scan_corpus_benchmark_counts_recall_precision_and_clean_violations(tmp_path, capsys):
    """`jaxtrain bench scan-corpus` on a corpus of one file written here: a per-step host sync it
    must find, and a labelled clean line; a missing file is one clear error, nothing measured."""
    from benchmarks.scan_corpus import ScanCorpusConfig, main
    from jaxtrain import ConfigError

    source = ("import jax\nimport jax.numpy as jnp\n\n"
              "@jax.jit\ndef step(w, x):\n    return w - 0.1 * jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)\n\n"
              "def train(w, batches):\n    for x in batches:\n        w = step(w, x)\n"
              "        print(float(jnp.sum(w)))\n    return w\n")
    path = tmp_path / "cache" / "someone" / "repo" / "train.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    corpus = {"rules": ["host-sync", "unjitted-grad"],
              "files": [{"repo": "someone/repo", "commit": "0" * 40, "path": "train.py",
                         "anti": [[11, "host-sync"]], "clean": [10]}]}
    (tmp_path / "corpus.json").write_text(json.dumps(corpus))
    config = ScanCorpusConfig(corpus=str(tmp_path / "corpus.json"), cache=str(tmp_path / "cache"), json_out=True)
    assert main(config) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rules"]["host-sync"]["labelled"] == 1 and result["recall"] == 1.0
    assert result["clean_violations"] == []
    with pytest.raises(ConfigError, match="1 of 1 corpus files are not in .*nothing measured"):
        main(ScanCorpusConfig(corpus=str(tmp_path / "corpus.json"), cache=str(tmp_path / "empty")))



def test_scan_corpus_reads_the_labels_of_a_variant_written_here_from_its_comments(tmp_path):
    """A `local` corpus entry (benchmarks/scan_variants/) is a file of the repository labelled by `# scan:` comments;
    the variants the corpus names exist and carry labels."""
    from benchmarks.scan_corpus import labels, measure

    root = tmp_path / "repo"
    (root / "variants").mkdir(parents=True)
    (root / "variants" / "v.py").write_text(
        "import jax\nimport jax.numpy as jnp\n\n"
        "@jax.jit\ndef step(w, x):\n    return w - 0.1 * jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)\n\n"
        "def train(w, batches):\n    for x in batches:\n        x = jnp.asarray(x)  # scan: per-batch-transfer\n"
        "        w = step(w, x)  # scan: clean\n    return w\n")
    corpus = {"rules": ["per-batch-transfer"], "files": [{"local": "variants/v.py", "modelled_on": "somewhere"}]}
    result = measure(corpus, tmp_path / "no-cache", root=root)
    assert (result["labelled"], result["found"], result["clean_lines"]) == (1, 1, 1)
    assert result["clean_violations"] == []
    repo = Path(__file__).resolve().parents[2]
    local = [e for e in json.loads((repo / "docs" / "scan_corpus.json").read_text())["files"] if "local" in e]
    assert local and all(labels((repo / e["local"]).read_text())[0] for e in local if "clean" not in e["local"])
