"""The A/B tool (``benchmarks/ab_trees.py``) on the CPU: switching trees swaps every launch setting of the
cutlass plans (header, TMA map encoders, thread counts, shared memory), and switching back restores them.
An A/B whose baseline kept this tree's encoder or thread count would time a kernel launched wrongly."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from tilegym.ops.cutlass import mla_decoding_split_kv as m

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "benchmarks" / "ab_trees.py"
PLANS = ("CutlassDecodePlan", "CutlassFp8WideDecodePlan")


@pytest.fixture
def ab(monkeypatch):
    spec = importlib.util.spec_from_file_location("ab_trees", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Leave the backend module as found, whatever the tool sets on it.
    monkeypatch.setattr(m, "HEADER", m.HEADER)
    monkeypatch.setattr(m, "SHARED_BYTES", m.SHARED_BYTES)
    for name in PLANS:
        cls = getattr(m, name)
        for attr in ("threads", "_encode_maps", "early_split"):
            monkeypatch.setattr(cls, attr, getattr(cls, attr))
    yield module
    m.split_kernel.cache_clear()


def other_tree(tmp_path: Path) -> Path:
    """A copy of this tree's cutlass backend whose launch settings all differ."""
    folder = tmp_path / "tree" / "tilegym" / "ops" / "cutlass"
    folder.mkdir(parents=True)
    for name in ("mla_decoding_split_kv.py", "mla_decoding_split_kv.cuh"):
        shutil.copy(ROOT / "tilegym" / "ops" / "cutlass" / name, folder / name)
    source = (folder / "mla_decoding_split_kv.py").read_text()
    source += (
        "\nSHARED_BYTES = 12345\n"
        "CutlassDecodePlan.threads = 128\n"
        "CutlassFp8WideDecodePlan.threads = 640\n"
        "CutlassDecodePlan.early_split = not CutlassDecodePlan.early_split\n"
        "def _other_encoder(self, kv, kpe, kv_scale, rows):\n"
        "    return ('other',)\n"
        "CutlassFp8WideDecodePlan._encode_maps = _other_encoder\n"
    )
    (folder / "mla_decoding_split_kv.py").write_text(source)
    return tmp_path / "tree"


def test_switching_trees_swaps_every_launch_setting_and_back(ab, tmp_path):
    here = {name: (getattr(m, name).threads, getattr(m, name)._encode_maps) for name in PLANS}
    early = m.CutlassDecodePlan.early_split
    shared, header = m.SHARED_BYTES, m.HEADER
    tree = other_tree(tmp_path)

    ab.use_tree(str(tree))
    assert Path(m.HEADER) == tree / "tilegym/ops/cutlass/mla_decoding_split_kv.cuh"
    assert m.SHARED_BYTES == 12345
    assert m.CutlassDecodePlan.threads == 128
    assert m.CutlassFp8WideDecodePlan.threads == 640
    assert m.CutlassDecodePlan.early_split is not early
    assert m.CutlassFp8WideDecodePlan._encode_maps(None, None, None, None, 64) == ("other",)

    ab.use_tree(str(ROOT))
    here_header = Path(m.__file__).parent / header  # the backend names its header relative to itself
    assert Path(m.HEADER).resolve() == here_header.resolve()
    assert m.SHARED_BYTES == shared
    assert m.CutlassDecodePlan.early_split is early
    for name in PLANS:
        threads, encoder = here[name]
        assert getattr(m, name).threads == threads
        restored = getattr(m, name)._encode_maps.__code__  # this tree's source, loaded again by the tool
        assert (restored.co_filename, restored.co_firstlineno, restored.co_code) == (
            encoder.__code__.co_filename,
            encoder.__code__.co_firstlineno,
            encoder.__code__.co_code,
        )
