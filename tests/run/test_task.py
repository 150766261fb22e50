"""The task wrapper's Flight Recorder variables (hpcml.run.task.flight_recorder_env)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

from hpcml.run import task


def fake_torch(monkeypatch, tmp_path: Path, version: str) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "torch" / "version.py").write_text(f"__version__ = '{version}'\ngit_version = 'x'\n")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: SimpleNamespace(
        origin=str(tmp_path / "torch" / "__init__.py")) if name == "torch" else real(name, *a))


def test_the_installed_torch_picks_the_variable_by_its_version(monkeypatch, tmp_path):
    fake_torch(monkeypatch, tmp_path, "2.4.1+cu121")
    env = task.flight_recorder_env({}, tmp_path / "observe")
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == str(task.FR_ENTRIES) and "TORCH_FR_BUFFER_SIZE" not in env


def test_torch_2_5_and_later_get_only_the_new_name(monkeypatch, tmp_path):
    fake_torch(monkeypatch, tmp_path, "2.13.0")
    env = task.flight_recorder_env({}, tmp_path / "observe")
    assert env["TORCH_FR_BUFFER_SIZE"] == str(task.FR_ENTRIES) and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env


def test_a_value_the_user_set_in_either_name_is_kept(tmp_path):
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        env = task.flight_recorder_env({name: "0"}, tmp_path)
        assert "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env
