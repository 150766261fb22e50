"""The service's JSON documents carry their schema tag and match their JSON Schema files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from hpcml import schemas
from hpcml.errors import UsageError
from hpcml.service import k8s, render
from hpcml.service import state as st
from tests import needs


def test_state_document_round_trips_and_matches_its_schema(tmp_path):
    s = st.ServiceState(name="mlflow", blueprint="mlflow.yaml", mode="local", backend="process",
                        directory=str(tmp_path / "mlflow"), ports={"http": 5000}, pid=1, pgid=1)
    st.write(s)
    doc = json.loads((tmp_path / "mlflow" / "service.json").read_text())
    assert next(iter(doc)) == "schema"
    jsonschema.validate(doc, schemas.load("service.state"))
    assert st.read(tmp_path / "mlflow") == s
    assert [x.name for x in st.instances(tmp_path)] == ["mlflow"]


def test_a_state_of_a_newer_hpcml_is_refused(tmp_path):
    (tmp_path / "service.json").write_text(json.dumps({"schema": "hpcml.service.state/2", "name": "x"}))
    with pytest.raises(UsageError, match="newer hpcml"):
        st.read(tmp_path)


def test_render_json_matches_its_schema():
    needs.module("kubernetes_validate")
    doc = render.render("mlflow", k8s.Target("vision")).to_json()
    jsonschema.validate(doc, schemas.load("service.render"))


def test_an_edited_or_replaced_state_file_is_one_line(tmp_path):
    """service.json lives where others may write: a FIFO in its place does not hang
    ``down``, an unknown key is not a TypeError traceback."""
    (tmp_path / "x").mkdir()
    os.mkfifo(tmp_path / "x" / "service.json")
    out = subprocess.run([sys.executable, "-m", "hpcml", "service", "down", "x", "--state-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    assert out.returncode == 2 and "a FIFO" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "service.json").write_text(json.dumps({"schema": "hpcml.service.state/1", "name": "y",
                                                            "pidd": 1}))
    with pytest.raises(UsageError, match="key 'pidd'"):
        st.read(tmp_path / "y")


def test_a_slurm_job_s_own_up_waits_for_the_submitter_s_lock(tmp_path):
    """``up --slurm`` holds the instance's lock from sbatch until the job is recorded; a job
    that starts within that time waits for it (SUBMITTER_WAIT_S) instead of being refused.
    Any other ``up`` is still refused at once, naming the holder."""
    directory = tmp_path / "web"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom pathlib import Path\nfrom hpcml.service import state\n"
        "with state.starting(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(1.5)\n"),
        str(directory)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match=rf"being started by another hpcml service up \(pid {holder.pid}"):
            with st.starting(directory):
                pass
        with st.starting(directory, wait=st.SUBMITTER_WAIT_S):     # held when asked: got once let go
            assert (directory / st.LOCK_FILE).read_text().strip() == str(os.getpid())
    finally:
        holder.kill()
        holder.wait()
