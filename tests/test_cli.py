"""``python -m tilegym``: usage, exit codes, per-command help, demo options, info's interpreter note."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import tilegym.cli
from tilegym.__main__ import COMMANDS, main

REPO = Path(__file__).resolve().parents[1]
HAS_GPU = torch.cuda.is_available()


def run_module(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m tilegym ARGS`` in a fresh interpreter, importing this checkout."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
    return subprocess.run(
        [sys.executable, "-m", "tilegym", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def keep_triton_interpret() -> Iterator[None]:
    """The demo sets TRITON_INTERPRET for CPU inputs; put the process's value back afterwards."""
    saved = os.environ.get("TRITON_INTERPRET")
    yield
    if saved is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = saved


def _fail_if_called(*args: object, **kwargs: object) -> int:
    raise AssertionError("the command ran instead of printing its help")


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_one_line_per_command_and_exits_0(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([flag]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("usage: python -m tilegym <command>")
    for name in ("info", "demo", "precompile", "bench"):
        assert name in COMMANDS
        assert sum(line.split()[:1] == [name] for line in lines) == 1, f"no single usage line for {name}"


def test_no_arguments_prints_the_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m tilegym")
    assert all(f"  {name}" in err for name in COMMANDS)


def test_unknown_command_is_named_and_the_commands_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err
    assert all(f"  {name}" in err for name in COMMANDS)


def test_module_entry_point_exit_codes() -> None:
    assert run_module("--help").returncode == 0
    result = run_module()
    assert result.returncode == 2 and "usage:" in result.stderr
    assert run_module("nope").returncode == 2


@pytest.mark.parametrize("command, runner", [("info", "info"), ("demo", "demo")])
def test_command_help_prints_and_does_not_run(
    command: str, runner: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tilegym.cli, runner, _fail_if_called)
    assert main([command, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m tilegym {command}")


def test_demo_help_names_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--backends" in out and "--device" in out


def test_demo_rejects_an_unknown_backend(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tilegym.cli, "demo", _fail_if_called)
    assert main(["demo", "--backends", "torch,nosuch"]) == 2
    err = capsys.readouterr().err
    assert "nosuch" in err and "torch, triton, tilecpp, aiter" in err


@pytest.mark.skipif(HAS_GPU, reason="checks the error for a machine without a GPU")
def test_demo_device_cuda_without_a_gpu_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "cuda"]) == 2
    assert "--device cuda" in capsys.readouterr().err


@pytest.mark.usefixtures("keep_triton_interpret")
def test_demo_runs_only_the_backends_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--backends", "torch", "--device", "cpu"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == ["torch"]


@pytest.mark.usefixtures("keep_triton_interpret")
def test_demo_reports_a_requested_backend_that_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    # tilecpp runs on NVIDIA GPUs only, so CPU inputs always rule it out.
    assert main(["demo", "--backends", "tilecpp,torch", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "tilecpp" in out and "UNAVAILABLE" in out
    assert any(line.startswith("torch") and line.endswith("ok") for line in out.splitlines())


@pytest.mark.skipif(HAS_GPU, reason="the interpreter note is for machines without a GPU")
def test_info_explains_the_triton_interpreter_switch_when_it_is_off() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = run_module("info", env=env)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # the note is wrapped: compare with single spaces
    for fact in (
        "runs only under Triton's interpreter (TRITON_INTERPRET=1)",
        "`make demo` and `python -m tilegym demo` set TRITON_INTERPRET=1 themselves",
        "before the first Triton import",
        '"0 active drivers"',
    ):
        assert fact in out


@pytest.mark.skipif(HAS_GPU, reason="the interpreter note is for machines without a GPU")
def test_info_has_no_interpreter_note_when_it_is_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "mla_decoding_split_kv:" in out
    assert "0 active drivers" not in out
