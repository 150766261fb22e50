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


def test_nccl_timing_is_armed_unless_the_user_chose(tmp_path):
    """Each collective's ``duration_ms`` is the arrival measure NCCL leaves (hpcml.observe.arrivals)."""
    assert task.flight_recorder_env({}, tmp_path)["TORCH_NCCL_ENABLE_TIMING"] == "1"
    assert "TORCH_NCCL_ENABLE_TIMING" not in task.flight_recorder_env({"TORCH_NCCL_ENABLE_TIMING": "0"}, tmp_path)


def test_the_heartbeat_key_comes_through_a_pipe_it_closes(tmp_path):
    """Local tasks: the rank's key in a pipe, read and closed before the rank starts."""
    import os

    import pytest

    from hpcml.observe.beat import rank_key
    read, write = os.pipe()
    os.write(write, rank_key(b"s" * 32, 3).hex().encode())
    os.close(write)
    assert task.beat_key({"--beat-fd": str(read)}, 3) == rank_key(b"s" * 32, 3)
    with pytest.raises(OSError):
        os.fstat(read)                                   # closed: the rank does not inherit it


def test_under_srun_the_key_is_derived_and_removed_from_the_environment(monkeypatch):
    import os

    import pytest

    from hpcml.errors import UsageError
    from hpcml.observe.beat import rank_key
    monkeypatch.setenv(task.ENV_BEAT_KEY, (b"t" * 32).hex())
    assert task.beat_key({}, 2) == rank_key(b"t" * 32, 2) and task.ENV_BEAT_KEY not in os.environ
    assert task.beat_key({}, 2) is None                  # a wrapper started by hand: nothing to sign with
    monkeypatch.setenv(task.ENV_BEAT_KEY, "not hex")
    with pytest.raises(UsageError, match="no heartbeat key from the launcher"):
        task.beat_key({}, 2)
