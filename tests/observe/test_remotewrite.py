"""Prometheus remote write from the recorder: the encoding decoded back by hand, the
delivery rules against a stub receiver (5xx retried, 4xx dropped, bounded queue), and the
recorder end to end into Debian's real prometheus (``--web.enable-remote-write-receiver``),
read back with PromQL."""

from __future__ import annotations

import http.server
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from hpcml.errors import UsageError
from hpcml.observe import remotewrite as rw
from hpcml.ports import free_port
from tests import needs

cramjam = needs.module("cramjam")

TRAIN = """
import sys, time
from hpcml import observe
for i in range(int(sys.argv[1])):
    with observe.section("step"):
        time.sleep(0.05)
    observe.log(step=i, loss=1.0 / (i + 1), tokens_per_s=1234.0)
open(sys.argv[2], "w").write("done")
"""


# --- a protobuf reader written from the spec's .proto, independent of the encoder

def _varint(buf: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return n, i


def _fields(buf: bytes):
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 2:
            size, i = _varint(buf, i)
            yield number, buf[i:i + size]
            i += size
        elif wire == 1:
            yield number, buf[i:i + 8]
            i += 8
        elif wire == 0:
            value, i = _varint(buf, i)
            yield number, value
        else:
            raise AssertionError(f"unexpected wire type {wire}")


def decode(buf: bytes) -> list[tuple[list[tuple[str, str]], list[tuple[int, float]]]]:
    out = []
    for number, ts in _fields(buf):
        assert number == 1
        labels, samples = [], []
        for n, part in _fields(ts):
            if n == 1:
                kv = dict(_fields(part))
                labels.append((kv[1].decode(), kv[2].decode()))
            else:
                assert n == 2
                s = dict(_fields(part))
                t = s[2] - (1 << 64) if s[2] >= 1 << 63 else s[2]
                samples.append((t, struct.unpack("<d", s[1])[0]))
        out.append((labels, samples))
    return out


def test_encoding_matches_the_bytes_worked_out_by_hand():
    body = rw.write_request([(rw.encode_labels({"x": "b", "__name__": "a"}), [(1000, 1.0)])])
    label_name = "0a0d" + "0a08" + b"__name__".hex() + "1201" + b"a".hex()
    label_x = "0a06" + "0a01" + b"x".hex() + "1201" + b"b".hex()
    sample = "120c" + "09" + struct.pack("<d", 1.0).hex() + "10" + "e807"
    assert body.hex() == "0a25" + label_name + label_x + sample


def test_encoding_round_trips_sorted_labels_and_samples():
    labels = {"slurm_job": "4242", "rank": "17", "__name__": "hpcml_step_seconds", "node": "nid00" + "é" * 70}
    samples = [(1_795_000_000_000 + i, 0.25 * i) for i in range(300)] + [(-5, float("inf"))]
    body = rw.write_request([(rw.encode_labels(labels), samples), (rw.encode_labels({"__name__": "b", "empty": ""}), [(1, -2.5)])])
    got = decode(bytes(cramjam.snappy.decompress_raw(cramjam.snappy.compress_raw(body))))
    assert got[0] == (sorted(labels.items()), samples)
    assert [n for n, _ in got[0][0]] == ["__name__", "node", "rank", "slurm_job"]      # the spec's order
    assert got[1] == ([("__name__", "b")], [(1, -2.5)])                                 # empty values left out


def test_throughput_names_are_the_reports():
    from hpcml.observe.report import THROUGHPUT_METRICS
    assert rw.THROUGHPUT_METRICS == THROUGHPUT_METRICS


@pytest.mark.parametrize("url", ["ftp://vm/api/v1/write", "vm:8428/api/v1/write", "http://", "http://vm:99999/x"])
def test_a_url_that_is_not_http_is_a_usage_error(url):
    with pytest.raises(UsageError) as exc:
        rw.config(url, env={})
    assert exc.value.key == "remote_write" and "\n" not in str(exc.value)


def test_settings_come_from_the_environment_when_not_given():
    assert rw.config(env={}) is None
    cfg = rw.config(env={rw.ENV_URL: "https://vm.example/api/v1/write", rw.ENV_TOKEN: "t0k",
                         rw.ENV_NO_JOB_LABEL: "1", rw.ENV_MAX_SERIES: "500"})
    assert cfg == rw.Config("https://vm.example/api/v1/write", job_label=False, max_series=500, token="t0k")
    assert rw.config("http://a/w", job_label=True, max_series=7, env={rw.ENV_NO_JOB_LABEL: "1"}).job_label
    with pytest.raises(UsageError) as exc:
        rw.config("http://a/w", env={rw.ENV_MAX_SERIES: "lots"})
    assert exc.value.key == "remote_write_max_series"


class _Task:
    def __init__(self, ntasks: int, gpus: tuple[str, ...], nodes: str = "n[001-256]") -> None:
        self.ntasks, self.gpus, self.nodes = ntasks, gpus, nodes


def test_the_budget_counts_nodes_gpus_and_ranks():
    cfg = rw.Config("http://a/w")
    # 1,024 ranks on 256 nodes, one GPU each: 256 x (7 + 4 x 16) + 1,024 x 2
    assert rw.check_budget(cfg, _Task(1024, ("0",)), {}, env={})["estimate"] == 20_224
    assert rw.check_budget(cfg, _Task(8, (), "n[1-2]"), {}, env={})["estimate"] == 2 * 7 + 8 * 2      # CPU only
    assert rw.check_budget(cfg, _Task(2, (), "n1"), {"gpu_uuids": {i: "u" for i in range(4)}}, env={"SLURM_JOB_NUM_NODES": "2"}
                           )["estimate"] == 2 * (7 + 4 * 16) + 2 * 2
    with pytest.raises(UsageError) as exc:
        rw.check_budget(cfg, _Task(4096, ("0",), "n[0001-1024]"), {}, env={})
    assert exc.value.key == "remote_write_max_series" and "80,896 series" in str(exc.value)


# --- delivery, against a stub receiver that answers what the test says

class _Stub:
    def __init__(self, statuses: list[int]) -> None:
        self.statuses, self.requests = statuses, []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"                 # keep-alive, as a real receiver

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                stub.requests.append((dict(self.headers), decode(bytes(cramjam.snappy.decompress_raw(body)))))
                status = stub.statuses.pop(0) if stub.statuses else 204
                body = b"" if status == 204 else b"out of order sample\n"        # 204: no body, as HTTP says
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/write"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def samples(self) -> list[tuple[int, float]]:
        return [s for _, series in self.requests for _, samples in series for s in samples]


def _writer(url: str, **kw) -> rw.RemoteWriter:
    cfg = rw.Config(url, token="s3cret", push_s=0.05)
    return rw.RemoteWriter(cfg, node="n7", rank=3, job="4242", node_writer=True, resolution=1.0, **kw)


def _rows(t0_ns: int, seconds: int) -> list[tuple]:
    rows = []
    for s in range(seconds):
        ts = t0_ns + s * 1_000_000_000
        rows += [(ts, "host", "cpu_percent", 50.0, None, None), (ts, "host", "proc_rss_bytes", 1e9, None, None),
                 (ts, "gpu", "power_w", 300.0, None, 1),
                 (ts, "section", "step", 0.2, s, None), (ts + 500_000_000, "section", "step", 0.4, s, None),
                 (ts, "metric", "samples_per_s", 10.0, s, None), (ts, "metric", "loss", 1.0, s, None)]
    return rows


def test_series_labels_headers_and_one_sample_per_interval(monkeypatch):
    stub, warnings = _Stub([]), []
    w = _writer(stub.url, warn=warnings.append)
    t0 = (time.time_ns() // 10**9 - 60) * 10**9
    w.update(_rows(t0, 5))
    meta = w.close()["remote_write"]
    assert meta["sent"] == 5 * 4 and meta["dropped"] == meta["unsent"] == meta["rejected"] == 0 and not warnings
    headers = stub.requests[0][0]
    assert headers["Content-Encoding"] == "snappy" and headers["Content-Type"] == "application/x-protobuf"
    assert headers["X-Prometheus-Remote-Write-Version"] == "0.1.0" and headers["Authorization"] == "Bearer s3cret"
    series = {}
    for _, sent in stub.requests:
        for labels, samples in sent:
            series.setdefault(tuple(labels), []).extend(samples)
    job = [("slurm_job", "4242")]
    assert set(series) == {
        (("__name__", "hpcml_host_cpu_percent"), ("node", "n7"), *job),
        (("__name__", "hpcml_gpu_power_w"), ("gpu", "1"), ("node", "n7"), *job),
        (("__name__", "hpcml_step_seconds"), ("node", "n7"), ("rank", "3"), *job),
        (("__name__", "hpcml_throughput"), ("name", "samples_per_s"), ("node", "n7"), ("rank", "3"), *job)}
    steps = series[(("__name__", "hpcml_step_seconds"), ("node", "n7"), ("rank", "3"), *job)]
    assert steps == [(t0 // 10**6 + s * 1000 + 500, pytest.approx(0.3)) for s in range(5)]   # mean, last time


def test_5xx_is_retried_and_4xx_dropped():
    stub, warnings = _Stub([503, 503]), []
    w = _writer(stub.url, warn=warnings.append)
    t0 = (time.time_ns() // 10**9 - 60) * 10**9
    w.update([(t0 + s * 10**9, "section", "step", float(s), s, None) for s in range(3)])
    deadline = time.time() + 60
    while w.stats["sent"] < 3 and time.time() < deadline:
        time.sleep(0.1)
    assert w.stats["failures"] == 2 and w.stats["sent"] == 3
    assert [v for _, v in stub.samples()] == [0.0, 1.0, 2.0] * 3           # the same batch three times
    assert any("failed (HTTP 503" in x for x in warnings) and any("delivering again" in x for x in warnings)
    stub.statuses[:] = [400]
    w.update([(t0 + 10 * 10**9, "section", "step", 9.0, 9, None)])
    meta = w.close()["remote_write"]
    assert meta["rejected"] == 1 and meta["sent"] == 3                 # not retried
    assert len(stub.requests) == 4 and any("rejected: HTTP 400 out of order sample" in x for x in warnings)


def test_the_queue_is_bounded_while_the_endpoint_is_down(monkeypatch):
    monkeypatch.setattr(rw, "QUEUE_SAMPLES", 50)
    warnings: list[str] = []
    w = _writer(f"http://127.0.0.1:{free_port('127.0.0.1')}/api/v1/write", warn=warnings.append)
    t0 = (time.time_ns() // 10**9 - 600) * 10**9
    w.update([(t0 + s * 10**9, "section", "step", 1.0, s, None) for s in range(500)])
    assert len(w._queue) <= 50 and w.stats["dropped"] >= 500 - 1 - 2 * 50       # the queue, and one batch being retried
    meta = w.close()["remote_write"]
    assert meta["sent"] == 0 and meta["dropped"] + meta["unsent"] == 500
    assert any("dropped" in x for x in warnings)


# --- the recorder end to end, into a real Prometheus

def _query(port: int, promql: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)["data"]["result"]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    needs.tool("prometheus")
    d = tmp_path_factory.mktemp("prom")
    (d / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    port = free_port("127.0.0.1")
    prom = subprocess.Popen(["prometheus", f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert prom.poll() is None and time.time() < deadline, "prometheus did not start"
            time.sleep(0.5)
        yield port
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()


def _record(tmp_path: Path, args: list[str], rank: int, local_rank: int, node: str = "n7", steps: int = 40,
            job: str = "4242", env: dict | None = None) -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    environ = {**os.environ, "SLURM_JOB_ID": job, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2",
               "SLURM_LOCALID": str(local_rank), "SLURMD_NODENAME": node, "SLURM_JOB_NODELIST": node,
               "HPCML_OBSERVE_FLUSH": "0.2", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "hpcml", "observe", "record", "--dir", str(tmp_path / f"job{job}"),
                             "--interval", "0.5", "--no-gpu", *args, "--", sys.executable, str(script), str(steps),
                             str(tmp_path / f"done-{job}-{rank}")],
                            env=environ, stderr=subprocess.PIPE, text=True)


def _poll(port: int, promql: str, n: int) -> list:
    deadline, got = time.time() + 90, []
    while time.time() < deadline:
        got = _query(port, promql)
        if len(got) >= n:
            return got
        time.sleep(0.5)
    return got


def test_a_recorded_job_lands_in_prometheus(prometheus, tmp_path):
    """Ranks 0 and 1 of node n7 push through the flag; rank 0 of job 4243 on n8 through the
    environment, as ``hpcml run`` passes it, without the job label."""
    url = f"http://127.0.0.1:{prometheus}/api/v1/write"
    procs = [_record(tmp_path, ["--remote-write", url], 0, 0), _record(tmp_path, ["--remote-write", url], 1, 1),
             _record(tmp_path, [], 0, 0, node="n8", job="4243",
                     env={"HPCML_REMOTE_WRITE": url, "HPCML_REMOTE_WRITE_NO_JOB_LABEL": "1"})]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "warning" not in err, err
    step = _poll(prometheus, 'hpcml_step_seconds{node="n7"}', 2)
    assert sorted((r["metric"]["rank"], r["metric"]["slurm_job"]) for r in step) == [("0", "4242"), ("1", "4242")]
    assert all(0.04 < float(r["value"][1]) < 1.0 for r in step)
    tput = _poll(prometheus, "hpcml_throughput", 3)
    assert {r["metric"]["name"] for r in tput} == {"tokens_per_s"} and all(float(r["value"][1]) == 1234 for r in tput)
    cpu = _poll(prometheus, "hpcml_host_cpu_percent", 2)      # local rank 0 only, labelled by node alone
    assert sorted(tuple(sorted(r["metric"].items())) for r in cpu) == [
        (("__name__", "hpcml_host_cpu_percent"), ("node", "n7"), ("slurm_job", "4242")),
        (("__name__", "hpcml_host_cpu_percent"), ("node", "n8"))]
    assert all(0 <= float(r["value"][1]) <= 100 for r in cpu)
    mem = _poll(prometheus, 'hpcml_host_mem_used_bytes{slurm_job="4242"}', 1)
    assert len(mem) == 1 and float(mem[0]["value"][1]) > 1e6
    n8 = _poll(prometheus, 'hpcml_step_seconds{node="n8"}', 1)
    assert n8[0]["metric"] == {"__name__": "hpcml_step_seconds", "node": "n8", "rank": "0"}
    counts = _poll(prometheus, 'count_over_time(hpcml_step_seconds{slurm_job="4242"}[10m])', 2)
    assert all(float(r["value"][1]) >= 2 for r in counts)              # one sample per interval, several
    meta = json.loads((tmp_path / "job4242" / "rank-00000.json").read_text())["remote_write"]
    assert meta["sent"] > 0 and meta["dropped"] == meta["rejected"] == meta["unsent"] == 0
    assert meta["budget"] == {"estimate": 7 + 2 * 2, "max_series": rw.MAX_SERIES, "job_label": True}


def _blackhole() -> socket.socket:
    """Accepts connections (the kernel's backlog) and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


@pytest.mark.parametrize("endpoint", ["refused", "silent"])
def test_an_endpoint_down_never_fails_the_job(tmp_path, endpoint):
    hole = _blackhole() if endpoint == "silent" else None
    port = hole.getsockname()[1] if hole else free_port("127.0.0.1")
    try:
        p = _record(tmp_path, ["--remote-write", f"http://127.0.0.1:{port}/api/v1/write"], 0, 0, steps=30)
        _, err = p.communicate(timeout=300)
    finally:
        if hole:
            hole.close()
    assert p.returncode == 0, err
    assert (tmp_path / "done-4242-0").read_text() == "done"             # the training ran to its end
    assert f"warning: remote write to http://127.0.0.1:{port}/api/v1/write: " in err and "samples dropped" in err
    meta = json.loads((tmp_path / "job4242" / "rank-00000.json").read_text())
    assert meta["exit_code"] == 0 and meta["remote_write"]["sent"] == 0
    assert meta["remote_write"]["dropped"] + meta["remote_write"]["unsent"] > 0
    if endpoint == "refused":       # a silent one is still waited on (30 s per request) when the job ends
        assert f"warning: remote write to http://127.0.0.1:{port}/api/v1/write failed" in err
        assert meta["remote_write"]["failures"] >= 1


@pytest.mark.parametrize("args, env, flag", [
    (["--remote-write", "ftp://vm/api/v1/write"], {}, "--remote-write"),
    ([], {"HPCML_REMOTE_WRITE": "vm:8428"}, "--remote-write"),
    (["--remote-write", "http://127.0.0.1:9/w", "--remote-write-max-series", "100"], {"SLURM_JOB_NUM_NODES": "64", "SLURM_NTASKS": "256"},
     "--remote-write-max-series"),
])
def test_bad_settings_are_one_line_and_exit_2(tmp_path, args, env, flag):
    p = _record(tmp_path, args, 0, 0, env=env)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("hpcml observe record: error:") and f"flag '{flag}'" in err, err
    assert not (tmp_path / "done-4242-0").exists() and not (tmp_path / "job4242").exists()


def test_hpcml_run_passes_remote_write_to_every_rank(prometheus, tmp_path):
    """``hpcml run --remote-write URL``: a real local run of 2 ranks; both ranks' step times
    and the node's host series reach Prometheus; a bad URL is refused before anything runs."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    url = f"http://127.0.0.1:{prometheus}/api/v1/write"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCML_REMOTE_WRITE"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--dir", "job", "--interval", "0.5",
                        "--no-report", "--remote-write", url, "--", "python", str(script), "40", str(tmp_path / "done")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    run_id = json.loads((tmp_path / "job" / "run.json").read_text())["job_id"] or "local"
    step = _poll(prometheus, f'hpcml_step_seconds{{slurm_job="{run_id}"}}', 2)
    assert sorted(r["metric"]["rank"] for r in step) == ["0", "1"]
    assert len(_poll(prometheus, f'hpcml_host_cpu_percent{{slurm_job="{run_id}"}}', 1)) == 1   # one writer per node
    bad = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "1", "--dir", "job2", "--remote-write",
                          "ftp://x", "--", "true"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "flag '--remote-write'" in bad.stderr and not (tmp_path / "job2").exists()
