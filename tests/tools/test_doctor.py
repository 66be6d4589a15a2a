"""`jaxtrain doctor`: every check reports a status, the jit check really compares with NumPy, and
a device the user expects but lacks is one clear failing line with exit code 1. Quick sizes only:
the figures themselves are machine-dependent and never asserted."""

import json

import jax
import jax.numpy as jnp
import pytest

from jaxtrain.tools.cli import main
from jaxtrain.tools.diagnose import doctor

NAMES = ["versions", "backend", "device memory", "jit", "transfer", "dispatch", "matmul f32", "matmul bf16",
         "cudnn attention", "jax config"]
on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks what a CPU-only machine reports")


@pytest.fixture(scope="module")
def checks():
    return doctor.run_checks(quick=True)


def test_every_check_is_present_with_a_status(checks):
    assert [c.name for c in checks] == NAMES
    for c in checks:
        assert c.status in doctor.STATUSES and c.value, c
        assert c.data["seconds"] >= 0
    assert not doctor.failed(checks), [c for c in checks if c.status == "fail"]
    found = {c.name: c for c in checks}
    assert found["versions"].data["jax"] == jax.__version__
    assert found["matmul f32"].data["gflop_s"] > 0 and found["dispatch"].data["per_call_us"] > 0


@on_cpu
def test_gpu_checks_are_skipped_on_a_cpu(checks):
    found = {c.name: c for c in checks}
    for name in ("matmul bf16", "cudnn attention"):
        assert found[name].status == "skip" and found[name].value == "n/a on cpu"


def test_jit_check_compares_with_numpy(monkeypatch):
    good = doctor.check_jit()
    assert good.status == "ok" and good.data["max_abs_diff"] < doctor.JIT_TOLERANCE
    right = doctor._probe
    monkeypatch.setattr(doctor, "_probe", lambda x, w: right(x, w) + 1e-3)  # a miscompiled result
    bad = doctor.check_jit()
    assert bad.status == "fail" and "differs from NumPy" in bad.detail
    assert bad.data["max_abs_diff"] == pytest.approx(1e-3, rel=1e-2)


def test_a_check_that_raises_becomes_a_fail_line_and_the_rest_still_run(monkeypatch):
    def broken(*args):
        raise RuntimeError("no kernel\nsecond line")

    monkeypatch.setattr(doctor, "check_transfer", broken)
    checks = doctor.run_checks(quick=True)
    assert [c.name for c in checks] == NAMES
    transfer = next(c for c in checks if c.name == "transfer")
    assert transfer.status == "fail" and transfer.detail == "RuntimeError: no kernel"
    assert doctor.failed(checks)


def test_expecting_more_devices_than_there_are_fails():
    check = doctor.check_backend(expect_devices=jax.device_count() + 1)
    assert check.status == "fail" and f"expected {jax.device_count() + 1} devices" in check.detail
    assert doctor.check_backend(jax.default_backend(), jax.device_count()).status in ("ok", "warn")


def test_a_changed_matmul_precision_warns():
    with jax.default_matmul_precision("highest"):
        check = doctor.check_config()
    assert check.status == "warn" and "jax_default_matmul_precision=highest" in check.detail
    assert jnp.zeros(()).dtype == jnp.float32  # nothing leaked out of the context


def test_cli_json_is_json_only(capsys):
    assert main(["doctor", "--quick", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] is True and payload["seconds"] > 0
    assert [c["name"] for c in payload["checks"]] == NAMES
    assert all(set(c) == {"name", "status", "value", "detail", "data"} for c in payload["checks"])


@on_cpu
def test_cli_expecting_a_gpu_on_a_cpu_fails_with_one_clear_line(capsys):
    assert main(["doctor", "--quick", "--expect-device", "gpu"]) == 1
    out = capsys.readouterr().out
    fails = [line for line in out.splitlines() if line.startswith("fail:")]
    assert len(fails) == 1, out
    assert fails[0].startswith("fail: expected a gpu device, found cpu") and "jax[cuda12]" in fails[0]
    assert ", 1 fail, " in out.splitlines()[-1]


def test_cli_table_and_a_bad_option(capsys):
    assert main(["doctor", "--quick"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        assert name in out
    assert main(["doctor", "--expect-device", "abacus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "expect-device" in err[0]


@on_cpu
def test_gpu_checks_judge_results_when_the_backend_says_gpu(monkeypatch):
    """The GPU-only checks' logic, run on a CPU that claims to be a GPU (no GPU in CI)."""
    from jaxtrain import engine
    from jaxtrain._src.models import attention

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(doctor, "ATTENTION_SHAPE", (1, 64, 2, 64))
    bf16 = doctor.check_bf16_matmul(n=128, repeats=1)
    assert bf16.status == "ok" and bf16.data["relative_error"] < doctor.BF16_TOLERANCE
    assert doctor.check_cudnn_attention().status == "warn"  # no cuDNN on a CPU: the XLA fallback is named
    monkeypatch.setattr(engine, "cudnn_attention", attention.xla)  # a working fused path: compared with float32
    check = doctor.check_cudnn_attention()
    assert check.status == "ok" and check.data["max_abs_diff"] < doctor.ATTENTION_TOLERANCE
    monkeypatch.setattr(engine, "cudnn_attention", lambda q, k, v: attention.xla(q, k, v) * 1.5)  # a wrong kernel
    assert doctor.check_cudnn_attention().status == "fail"


def test_a_full_checklist_records_the_matmul_rate_for_every_runs_profile(tmp_path, monkeypatch):
    from jaxtrain._src import machine

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    device = jax.local_devices()[0]
    n = machine.standard_matmul_size(device)
    checks = [doctor.Check("matmul f32", "ok", "", "", {"gflop_s": 50.0, "n": n})]
    doctor.record_matmul_rate(checks, quick=True)  # a quick run's rough figure is not kept
    assert machine.cached_matmul_rate(device) is None
    doctor.record_matmul_rate(checks, quick=False)
    assert machine.cached_matmul_rate(device) == 50e9
    assert (tmp_path / "jaxtrain" / "machine.json").is_file()


def test_the_library_never_imports_the_tools():
    import pathlib
    import re

    import jaxtrain._src

    root = pathlib.Path(jaxtrain._src.__file__).parent
    imports = re.compile(r"^\s*(from|import)\s+jaxtrain\.tools", re.M)
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py") if imports.search(p.read_text())]
    assert offenders == []


def test_the_config_check_names_the_cache_the_command_keeps_where_jax_has_none(monkeypatch, tmp_path):
    """This process's JAX has no compilation cache (as `jaxtrain doctor`'s own has not), yet the `jaxtrain`
    command keeps one: the check says where, or that JAXTRAIN_COMPILE_CACHE=off turned it off."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    suites = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        monkeypatch.setenv("JAXTRAIN_COMPILE_CACHE", str(tmp_path / "xla"))
        kept = doctor.check_config()
        monkeypatch.setenv("JAXTRAIN_COMPILE_CACHE", "off")
        off = doctor.check_config()
    finally:
        jax.config.update("jax_compilation_cache_dir", suites)
    assert "JAX's compilation cache unset" in kept.value
    assert (f"the jaxtrain command keeps compiled programs in {tmp_path / 'xla'} (JAXTRAIN_COMPILE_CACHE=off"
            in kept.detail)
    assert "JAXTRAIN_COMPILE_CACHE=off: the jaxtrain command compiles every program afresh" in off.detail
