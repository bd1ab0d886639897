"""Registry and selection rules of tilegym.backend (docs/design.md, 'Registry and selector')."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading

import pytest
import torch

import tilegym
from tilegym import backend as registry
from tilegym.selection import TableStore
from tilegym.testing import make_mla_inputs

OP = "mla_decoding_split_kv"


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> registry.Registry:
    """A fresh registry declaring the built-in backends (no modules, no entry points, no tables)."""
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    registry.set_backend(None)
    specs = [dataclasses.replace(spec, module=None) for spec in registry.BUILTIN_BACKENDS]
    yield registry.Registry(specs, entry_point_group=None, tables=TableStore.from_tables())
    registry.set_backend(None)


class FakeCall:
    """Just what selection reads from a validated call."""

    def __init__(self, vendor: str = "cpu", heads: int = 16) -> None:
        self.vendor = vendor
        self.device = torch.device("cpu")
        self.heads = heads


def register_fake(reg, backend: str, vendors=("nvidia", "amd", "cpu"), reasons=None, op: str = OP) -> None:
    reg.register_impl(op, backend, vendors=vendors, supports=lambda call: list(reasons or []))(lambda call: backend)


def test_duplicate_registration_is_an_error(scratch_registry):
    register_fake(scratch_registry, "torch")
    with pytest.raises(ValueError, match="already registered"):
        register_fake(scratch_registry, "torch")


def test_register_rejects_unknown_backend_and_vendor(scratch_registry):
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        register_fake(scratch_registry, "cuda")
    with pytest.raises(ValueError, match="vendors"):
        register_fake(scratch_registry, "torch", vendors=("intel",))


@pytest.mark.parametrize("vendor, expected", [("nvidia", "tilecpp"), ("amd", "aiter"), ("cpu", "torch")])
def test_auto_picks_first_of_vendor_priority(scratch_registry, vendor, expected):
    for name in ("torch", "triton", "tilecpp", "aiter"):
        register_fake(scratch_registry, name)
    assert scratch_registry.select(OP, FakeCall(vendor)).backend == expected


def test_auto_skips_backends_that_cannot_run(scratch_registry):
    register_fake(scratch_registry, "tilecpp", reasons=["no cubin"])
    register_fake(scratch_registry, "triton")
    register_fake(scratch_registry, "torch")
    assert scratch_registry.select(OP, FakeCall("nvidia")).backend == "triton"


def test_auto_error_lists_every_backend_with_reasons(scratch_registry):
    register_fake(scratch_registry, "tilecpp", reasons=["no cubin for sm_90"])
    register_fake(scratch_registry, "triton", reasons=["triton not installed"])
    register_fake(scratch_registry, "torch", vendors=("cpu",))
    with pytest.raises(tilegym.BackendUnavailableError) as info:
        scratch_registry.select(OP, FakeCall("nvidia"))
    message = str(info.value)
    for text in ("tilecpp: no cubin for sm_90", "triton: triton not installed", "torch: runs on cpu", "aiter:"):
        assert text in message


def test_explicit_backend_never_falls_back(scratch_registry):
    register_fake(scratch_registry, "triton", reasons=["head dim 100 is not supported"])
    register_fake(scratch_registry, "torch")
    with pytest.raises(tilegym.BackendUnavailableError, match="'triton' .*head dim 100 is not supported"):
        scratch_registry.select(OP, FakeCall("nvidia"), "triton")


def test_explicit_backend_without_implementation(scratch_registry):
    register_fake(scratch_registry, "torch")
    with pytest.raises(tilegym.BackendUnavailableError, match="no implementation of this op; implemented by: torch"):
        scratch_registry.select(OP, FakeCall(), "aiter")


def test_probe_reasons_block_a_backend_and_are_cached(scratch_registry):
    calls = []

    def probe():
        calls.append(1)
        return ["aiter needs ROCm"]

    scratch_registry.register_probe("aiter", probe)
    register_fake(scratch_registry, "aiter")
    register_fake(scratch_registry, "torch")
    with pytest.raises(tilegym.BackendUnavailableError, match="aiter needs ROCm"):
        scratch_registry.select(OP, FakeCall("amd"), "aiter")
    assert scratch_registry.select(OP, FakeCall("amd")).backend == "torch"
    assert len(calls) == 1


def test_probe_that_raises_becomes_a_reason(scratch_registry):
    def probe():
        raise RuntimeError("ROCm version file not found")

    scratch_registry.register_probe("aiter", probe)
    register_fake(scratch_registry, "aiter")
    assert scratch_registry.backend_status(OP, "amd")["aiter"] == [
        "probe failed: RuntimeError: ROCm version file not found"
    ]


@pytest.mark.parametrize("name", ["cuda", "Torch", "", None, 3])
def test_unknown_names_list_the_valid_ones(scratch_registry, name):
    register_fake(scratch_registry, "torch")
    with pytest.raises(ValueError, match="valid names are torch, triton, tilecpp, aiter, cutlass, auto"):
        scratch_registry.select(OP, FakeCall(), name if name is not None else 5)
    if isinstance(name, str):
        with pytest.raises(ValueError, match="valid names"):
            tilegym.set_backend(name)
        with pytest.raises(ValueError, match="valid names"):
            with tilegym.use_backend(name):
                pass


def test_precedence_kwarg_context_global_env(scratch_registry, monkeypatch):
    for name in ("torch", "triton", "tilecpp", "aiter"):
        register_fake(scratch_registry, name)
    call = FakeCall("nvidia")
    assert scratch_registry.select(OP, call).backend == "tilecpp"
    monkeypatch.setenv(registry.ENV_VAR, "aiter")
    assert scratch_registry.select(OP, call).backend == "aiter"
    tilegym.set_backend("triton")
    assert scratch_registry.select(OP, call).backend == "triton"
    with tilegym.use_backend("torch"):
        assert scratch_registry.select(OP, call).backend == "torch"
        assert scratch_registry.select(OP, call, "tilecpp").backend == "tilecpp"
    assert scratch_registry.select(OP, call).backend == "triton"
    tilegym.set_backend(None)
    assert scratch_registry.select(OP, call).backend == "aiter"


def test_env_var_with_unknown_name_is_named_in_error(scratch_registry, monkeypatch):
    register_fake(scratch_registry, "torch")
    monkeypatch.setenv(registry.ENV_VAR, "cudnn")
    with pytest.raises(ValueError, match="TILEGYM_BACKEND: unknown backend 'cudnn'"):
        scratch_registry.select(OP, FakeCall())


def test_use_backend_nesting_and_restoration(scratch_registry):
    for name in ("torch", "triton", "tilecpp"):
        register_fake(scratch_registry, name)
    call = FakeCall("nvidia")
    with tilegym.use_backend("triton"):
        with tilegym.use_backend("torch"):
            assert scratch_registry.select(OP, call).backend == "torch"
            with tilegym.use_backend("auto"):
                assert scratch_registry.select(OP, call).backend == "tilecpp"
        assert scratch_registry.select(OP, call).backend == "triton"
    assert registry.requested_backend() == ("auto", "default")


def test_use_backend_restored_after_exception(scratch_registry):
    with pytest.raises(KeyError):
        with tilegym.use_backend("triton"):
            raise KeyError("boom")
    assert registry.requested_backend() == ("auto", "default")


def test_use_backend_is_per_thread(scratch_registry):
    seen = {}
    inside = threading.Event()
    release = threading.Event()

    def worker():
        with tilegym.use_backend("triton"):
            inside.set()
            release.wait(5)
            seen["worker"] = registry.requested_backend()[0]

    thread = threading.Thread(target=worker)
    thread.start()
    inside.wait(5)
    seen["main"] = registry.requested_backend()[0]
    release.set()
    thread.join()
    assert seen == {"worker": "triton", "main": "auto"}


def test_vendor_comes_from_the_tensor_device(monkeypatch):
    assert registry.device_vendor(torch.device("cpu")) == "cpu"
    monkeypatch.setattr(torch.version, "hip", None)
    assert registry.device_vendor(torch.device("cuda", 0)) == "nvidia"
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert registry.device_vendor(torch.device("cuda", 0)) == "amd"


def test_real_registry_runs_torch_by_default_on_cpu():
    x = make_mla_inputs(1, 2, 8, 16, 4)
    call = tilegym.ops.contract.validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe)
    assert registry.select(OP, call).backend == "torch"
    status = registry.backend_status(OP, "cpu")
    assert status["torch"] == []
    assert set(status) == set(registry.BACKENDS)


def test_explicit_gpu_backend_on_cpu_tensors_raises_with_reason():
    x = make_mla_inputs(1, 16, 8)
    with pytest.raises(tilegym.BackendUnavailableError, match="'tilecpp'"):
        tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, backend="tilecpp")


def test_import_is_light_and_needs_no_toolchain(tmp_path):
    """`import tilegym` imports no triton/aiter, starts no subprocess, creates no directory."""
    script = f"""
import os, subprocess, sys
import torch  # torch's own import may run ldconfig; only tilegym's import is checked below
sys.modules['triton'] = None  # any attempt to import triton now raises ImportError
sys.modules['aiter'] = None
def forbid(*a, **k):
    raise AssertionError('subprocess at import')
subprocess.Popen.__init__ = forbid
os.environ['XDG_CACHE_HOME'] = {str(tmp_path / "xdg")!r}
os.environ['TILEGYM_CACHE_DIR'] = {str(tmp_path / "cache")!r}
import tilegym
assert 'tilegym.ops.reference' not in sys.modules, 'registry loaded at import'
assert not os.path.exists({str(tmp_path / "xdg")!r}) and not os.path.exists({str(tmp_path / "cache")!r})
print('ok')
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_info_command_reports_every_backend():
    info = subprocess.run([sys.executable, "-m", "tilegym", "info"], capture_output=True, text=True, timeout=300)
    assert info.returncode == 0, info.stderr
    assert "mla_decoding_split_kv:" in info.stdout and "torch    available" in info.stdout
    assert "aiter    unavailable" in info.stdout


def test_priorities_are_declared_data_with_arch_overrides():
    reg = registry.Registry(
        [
            registry.BackendSpec("slow", priority={"nvidia": 1}),
            registry.BackendSpec("fast", priority={"nvidia": 2, "sm_90": 0}),
        ],
        entry_point_group=None,
    )
    assert reg.vendor_priority("nvidia") == ("fast", "slow")
    assert reg.vendor_priority("nvidia", "sm_90") == ("slow", "fast")
    assert reg.vendor_priority("amd") == ()
    reg.register_backend("late", priority={"nvidia": 3})
    assert reg.vendor_priority("nvidia") == ("late", "fast", "slow")


@pytest.mark.parametrize(
    "name, priority, match",
    [
        ("torch", {}, "already declared"),
        ("auto", {}, "identifier"),
        ("x-y", {}, "identifier"),
        ("x", {"intel": 1}, "priority"),
    ],
)
def test_register_backend_validates(scratch_registry, name, priority, match):
    with pytest.raises(ValueError, match=match):
        scratch_registry.register_backend(name, priority=priority)


def test_backend_modules_that_fail_or_are_absent_are_reported(tmp_path):
    reg = registry.Registry(
        [
            registry.BackendSpec("missing", module="tilegym_no_such_module"),
            registry.BackendSpec("later", module="tilegym_no_such_module_either", optional=True),
        ],
        entry_point_group=None,
    )
    status = reg.backend_status(OP, "cpu")
    assert status["missing"][0].startswith("module tilegym_no_such_module failed to load: ModuleNotFoundError")
    assert status["later"] == ["not part of this installation (no module tilegym_no_such_module_either)"]
    # The optional builtin cutlass backend is installed: on a CPU it says why it cannot run.
    assert registry.backend_status(OP, "cpu")["cutlass"] == ["needs an NVIDIA GPU (none visible to PyTorch)"]


def test_override_replaces_and_restores(scratch_registry):
    register_fake(scratch_registry, "torch", vendors=("nvidia",))
    before = scratch_registry.implementations(OP)["torch"]
    with scratch_registry.override(OP, "torch", vendors=("cpu",)) as impl:
        assert scratch_registry.select(OP, FakeCall("cpu")) is impl
    assert scratch_registry.implementations(OP)["torch"] is before
    with pytest.raises(KeyError), scratch_registry.override(OP, "triton", run=lambda call: "t", vendors=("cpu",)):
        assert scratch_registry.select(OP, FakeCall("cpu"), "triton").run(None) == "t"
        raise KeyError("boom")
    assert "triton" not in scratch_registry.implementations(OP)


def test_clear_probe_cache_reruns_probes(scratch_registry):
    answers = [["not yet"], []]
    scratch_registry.register_probe("triton", lambda: answers.pop(0))
    assert scratch_registry.unavailable_reasons("triton") == ["not yet"]
    assert scratch_registry.unavailable_reasons("triton") == ["not yet"]
    scratch_registry.clear_probe_cache()
    assert scratch_registry.unavailable_reasons("triton") == []


def test_backends_attribute_is_the_declared_names():
    from tilegym.backend import BACKENDS

    assert BACKENDS == tilegym.BACKENDS == tuple(registry.backend_names())
    assert BACKENDS[:5] == ("torch", "triton", "tilecpp", "aiter", "cutlass")
