"""Live export scraped by Debian's real prometheus on loopback, queried over its HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="Debian's prometheus is not installed (scripts/test installs it as root)")

TRAIN = """
import time
from hpcml import observe
for i in range(10**6):
    with observe.section("step"):
        time.sleep(0.05)
    observe.log(step=i, loss=1.0 / (i + 1), tokens_per_s=1234.0)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(port: int, promql: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]


def test_prometheus_scrapes_a_recorded_job(tmp_path):
    export_port, prom_port = _free_port(), _free_port()
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_PROCID": "3", "SLURM_LOCALID": "0",
           "SLURMD_NODENAME": "n7", "HPCML_OBSERVE_FLUSH": "0.2"}
    recorder = subprocess.Popen([sys.executable, "-m", "hpcml", "observe", "record", "--dir",
                                 str(tmp_path / "job"), "--interval", "0.2", "--prometheus-port",
                                 str(export_port), "--", sys.executable, str(script)], env=env)
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
        while time.time() < deadline and not loss:
            time.sleep(1)
            try:
                loss = _query(prom_port, 'hpcml_metric{name="loss"}')
            except OSError:
                continue
        assert loss, "prometheus never got hpcml_metric{name=loss}"
        labels = loss[0]["metric"]
        assert (labels["slurm_job"], labels["rank"], labels["node"], labels["job"]) == ("4242", "3", "n7", "hpcml")
        assert 0 < float(loss[0]["value"][1]) <= 1
        host = _query(prom_port, 'hpcml_host{name="proc_rss_bytes"}')
        assert host and float(host[0]["value"][1]) > 1e6
        step = _query(prom_port, "hpcml_section_seconds")
        assert step and step[0]["metric"]["name"] == "step"
    finally:
        prom.terminate()
        recorder.terminate()
        prom.wait(timeout=30)
        recorder.wait(timeout=30)
    assert (tmp_path / "job" / "rank-00003.arrows").exists()
