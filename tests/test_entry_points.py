"""Third-party backends through the ``tilegym.backends`` entry-point group.

Each test "installs" a tiny dummy distribution into ``tmp_path`` (a ``*.dist-info`` with
METADATA and entry_points.txt, plus its modules) and puts it on ``sys.path``; a fresh
``Registry`` (or a fresh interpreter) discovers it.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tilegym
from tilegym import backend
from tilegym.selection import TableStore

OP = "mla_decoding_split_kv"
ROOT = Path(__file__).resolve().parents[1]
MODULES = ("dummy_tilegym_backend", "dummy_tilegym_module_backend")

ENTRY_POINTS = """\
[tilegym.backends]
dummy = dummy_tilegym_backend:register
halfway = dummy_tilegym_backend:register_halfway
broken = dummy_tilegym_backend_missing:register
dummymod = dummy_tilegym_module_backend
"""

CALLABLE_MODULE = """\
LOADS = []


def register(registry):
    LOADS.append(registry)
    registry.register_backend("dummy", priority={"cpu": 50})
    registry.register_impl("mla_decoding_split_kv", "dummy", vendors=("cpu",))(lambda call: "dummy ran")


def register_halfway(registry):
    registry.register_backend("halfway")
    raise RuntimeError("no device library")
"""

MODULE_MODULE = """\
from tilegym.backend import register_backend, register_impl

register_backend("dummymod", priority={})


@register_impl("mla_decoding_split_kv", "dummymod", vendors=("cpu",))
def run(call):
    return "dummymod ran"
"""


class FakeCall:
    vendor = "cpu"
    device = torch.device("cpu")


def install_dummy(site: Path) -> Path:
    dist = site / "dummy_tilegym_backend-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dummy-tilegym-backend\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    (site / "dummy_tilegym_backend.py").write_text(CALLABLE_MODULE)
    (site / "dummy_tilegym_module_backend.py").write_text(MODULE_MODULE)
    return site


@pytest.fixture
def dummy_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The dummy distribution on sys.path (the default registry is loaded first, so it never sees it)."""
    backend.backend_names()
    site = install_dummy(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    yield site
    for name in MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def fresh(dummy_site) -> backend.Registry:
    torch_only = dataclasses.replace(backend.BUILTIN_BACKENDS[0], module=None)
    reg = backend.Registry([torch_only], tables=TableStore.from_tables())
    reg.register_impl(OP, "torch", vendors=("cpu",))(lambda call: "torch ran")
    return reg


def test_discovery_is_lazy_and_loads_each_entry_point_once(fresh):
    assert "dummy_tilegym_backend" not in sys.modules
    assert fresh.backend_names() == ["torch", "broken", "dummy", "dummymod", "halfway"]
    fresh.implementations(OP)
    fresh.backend_status(OP, "cpu")
    assert sys.modules["dummy_tilegym_backend"].LOADS == [fresh]


def test_entry_point_backend_is_selected_by_name_and_by_auto(fresh):
    assert fresh.vendor_priority("cpu") == ("dummy", "torch")
    assert fresh.select(OP, FakeCall()).run(None) == "dummy ran"
    assert fresh.select(OP, FakeCall(), "torch").backend == "torch"
    assert fresh.select(OP, FakeCall(), "dummymod").run(None) == "dummymod ran"
    assert "dummymod" not in fresh.vendor_priority("cpu")  # no rank: auto runs it only where a table ranks it


def test_broken_entry_points_are_reported_not_raised(fresh):
    status = fresh.backend_status(OP, "cpu")
    assert status["dummy"] == [] and status["torch"] == []
    (broken,) = status["broken"]
    assert broken.startswith("entry point broken = dummy_tilegym_backend_missing:register failed to load:")
    assert "ModuleNotFoundError" in broken
    assert status["halfway"] == [
        "entry point halfway = dummy_tilegym_backend:register_halfway failed to load: RuntimeError: no device library"
    ]
    with pytest.raises(tilegym.BackendUnavailableError, match="'broken' .*ModuleNotFoundError"):
        fresh.select(OP, FakeCall(), "broken")


def test_unknown_name_lists_entry_point_backends(fresh):
    with pytest.raises(ValueError, match="valid names are torch, broken, dummy, dummymod, halfway, auto"):
        fresh.select(OP, FakeCall(), "cudnn")


def test_installed_backend_in_a_fresh_interpreter(tmp_path):
    """`import tilegym` loads no entry point; the first query does; auto picks the dummy on CPU."""
    site = install_dummy(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    script = textwrap.dedent(
        """
        import sys
        import tilegym
        assert "dummy_tilegym_backend" not in sys.modules, "entry points loaded at import"
        from tilegym.ops.contract import validate_mla_decoding
        from tilegym.testing import make_mla_inputs
        x = make_mla_inputs(1, 16, 8)
        call = validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe)
        print(tilegym.backend.select("mla_decoding_split_kv", call).backend, *tilegym.backend_names())
        print(tilegym.backend_status("mla_decoding_split_kv", "cpu")["broken"][0])
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    names, broken = run.stdout.splitlines()
    assert names.split() == [
        "dummy",
        "torch",
        "triton",
        "tilecpp",
        "aiter",
        "cutlass",
        "broken",
        "dummy",
        "dummymod",
        "halfway",
    ]
    assert broken.startswith("entry point broken = dummy_tilegym_backend_missing:register failed to load")
