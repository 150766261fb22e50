"""Live export scraped by Debian's real prometheus on loopback, queried over its HTTP API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from hpcml.ports import free_port
from tests import needs


@pytest.fixture(autouse=True)
def _prometheus() -> None:
    needs.tool("prometheus")

TRAIN = """
import time
from hpcml import observe
for i in range(10**6):
    with observe.section("step"):
        time.sleep(0.05)
    observe.log(step=i, loss=1.0 / (i + 1), tokens_per_s=1234.0)
"""


def _free_port() -> int:
    return free_port("127.0.0.1")


def _query(port: int, promql: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]


def _recorder(tmp_path, script, port, rank, local_rank):
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_PROCID": str(rank), "SLURM_NTASKS": "8", "SLURM_LOCALID": str(local_rank),
           "SLURMD_NODENAME": "n7", "HPCML_OBSERVE_FLUSH": "0.2"}
    return subprocess.Popen([sys.executable, "-m", "hpcml", "observe", "record", "--dir",
                             str(tmp_path / "job"), "--interval", "0.2", "--prometheus-port",
                             str(port), "--", sys.executable, str(script)], env=env)


def test_prometheus_scrapes_a_recorded_job(tmp_path):
    """Two ranks of one node: local rank 0 serves the node's endpoint, rank 5 (local
    rank 1) forwards its rows to it; Prometheus sees both ranks on one target."""
    export_port, prom_port = _free_port(), _free_port()
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    recorders = [_recorder(tmp_path, script, export_port, 3, 0), _recorder(tmp_path, script, export_port, 5, 1)]
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: hpcml
    static_configs: [{{targets: ["127.0.0.1:{export_port}"]}}]
""")
    prom = subprocess.Popen(["prometheus", f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 90
        loss = []
        while time.time() < deadline and len(loss) < 2:
            time.sleep(1)
            try:
                loss = _query(prom_port, 'hpcml_metric{name="loss"}')
            except OSError:
                continue
        assert len(loss) == 2, f"prometheus has {loss}"
        labels = sorted((r["metric"]["rank"], r["metric"]["slurm_job"], r["metric"]["node"],
                         r["metric"]["job"]) for r in loss)
        assert labels == [("3", "4242", "n7", "hpcml"), ("5", "4242", "n7", "hpcml")]
        assert all(0 < float(r["value"][1]) <= 1 for r in loss)
        host = _query(prom_port, 'hpcml_host{name="proc_rss_bytes"}')
        assert {r["metric"]["rank"] for r in host} == {"3", "5"}
        assert all(float(r["value"][1]) > 1e6 for r in host)
        wrote = _query(prom_port, 'hpcml_host{name="proc_write_calls"}')       # storage beside throughput, live
        assert {r["metric"]["rank"] for r in wrote} == {"3", "5"}, wrote
        step = _query(prom_port, "hpcml_section_seconds")
        assert step and step[0]["metric"]["name"] == "step"
    finally:
        prom.terminate()
        for r in recorders:
            r.terminate()
        prom.wait(timeout=30)
        for r in recorders:
            r.wait(timeout=30)
    assert (tmp_path / "job" / "rank-00003.arrows").exists()
