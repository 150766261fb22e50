"""``hpcml env venv``: a venv layered on the image's Python.

``python3 -m venv --system-site-packages PATH`` runs inside the container with PATH bound
read-write at the same path, so the venv's interpreter links point at the image's Python
and it sees the image's packages (NGC's torch); packages installed into it persist on
shared storage. The EDF then activates it with ``com.hpcml.venv`` (which also sets
PYTHONNOUSERSITE, unless ``com.hpcml.user_site`` is true).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcml.env.model import VENV, Environment, Mount
from hpcml.errors import HpcmlError, UsageError
from hpcml.schemas import tag


class VenvError(HpcmlError):
    """The venv command failed inside the container."""

    exit_code = 1


@dataclass
class VenvResult:
    path: str
    runtime: str
    mounted: bool               # the EDF already mounts PATH at the same path

    def edf_lines(self) -> list[str]:
        """The TOML to add to the EDF."""
        lines = [] if self.mounted else [
            f'mounts = ["{self.path}:{self.path}"]   # add to your existing mounts list']
        return lines + ["[annotations]", f'{VENV} = "{self.path}"']

    def to_json(self) -> dict:
        return {"schema": tag("env.venv", 1), "path": self.path, "runtime": self.runtime,
                "mounted": self.mounted,
                "edf_lines": self.edf_lines()}


def _covered(env: Environment, path: str) -> bool:
    return any(m.source == m.target and (path == m.target or path.startswith(m.target.rstrip("/") + "/"))
               and not m.readonly for m in env.mounts)


def execute(env: Environment, command: list[str], *, runtime: str | None = None,
            environ: Mapping[str, str] | None = None, timeout: float | None = 600) -> subprocess.CompletedProcess:
    """``hpcml.env.run.run`` with the output captured as text (for probes and tests)."""
    from hpcml.env.run import choose
    environ = dict(os.environ if environ is None else environ)
    launch = choose(env, runtime or "auto", environ).render(env, command, environ=environ)
    for key, value in launch.environ.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    try:
        for step in launch.prepare:
            subprocess.run(step, check=True, capture_output=True, timeout=120)
        return subprocess.run(launch.argv, env=environ, capture_output=True, text=True, timeout=timeout)
    except subprocess.CalledProcessError as exc:
        raise VenvError(f"{launch.runtime}: preparing the container failed: {' '.join(exc.cmd)}: "
                        f"{exc.stderr.decode(errors='replace').strip()}") from None
    except subprocess.TimeoutExpired as exc:
        raise VenvError(f"{launch.runtime}: timed out after {exc.timeout} s") from None
    finally:
        for step in launch.cleanup:
            subprocess.run(step, capture_output=True, timeout=120)


def create_venv(env: Environment, path: str | os.PathLike[str], *, runtime: str | None = None) -> VenvResult:
    """Create a venv at ``path`` (an absolute host path, also used in the container)."""
    target = os.path.abspath(os.fspath(path))
    if os.path.exists(target) and not os.path.isdir(target):
        raise UsageError(f"{target} exists and is not a directory", key="PATH")
    Path(target).mkdir(parents=True, exist_ok=True)
    mounted = _covered(env, target)
    annotations = {k: v for k, v in env.annotations.items() if k != VENV}   # not activated yet
    build = dataclasses.replace(env, annotations=annotations, mounts=list(env.mounts)
                                + ([] if mounted else [Mount(target, target)]))
    from hpcml.env.run import choose, run
    name = choose(build, runtime or "auto").name
    code = run(build, ["python3", "-m", "venv", "--system-site-packages", target], runtime=name)
    if code != 0:
        raise VenvError(f"python3 -m venv failed in the container (exit {code}; its message is above): "
                        "does the image have python3 with the venv module?")
    if not (Path(target) / "pyvenv.cfg").is_file():
        raise VenvError(f"python3 -m venv exited 0 but {target}/pyvenv.cfg is missing")
    return VenvResult(target, name, mounted)
