"""Storage beside throughput (``hpcml.observe.iobursts``): a real ``hpcml run`` of 2 DDP ranks
(gloo) whose rank 0 saves a 400 MB checkpoint with ``torch.save`` every 100 steps, as a
training script does: the report gives each rank's reads and writes, finds the job-wide
stalls and says they came with the checkpoint's write burst, with the figures; and the
filesystem client counters are read from text made the way Lustre and the kernel's NFS
client print them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcml.samplers.fsclients import FsClients, lustre_bytes, nfs_bytes

ROOT = Path(__file__).resolve().parents[2]

TRAIN = """\
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
blob = torch.randn(100_000_000) if rank == 0 else None     # 400 MB of state
for step in range(1, 401):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.01)
    if step % 100 == 0 and rank == 0:
        path = f"ckpt-{step}.pt"
        torch.save({"model": model.state_dict(), "blob": blob}, path)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        os.unlink(path)
print("done", flush=True)
"""


@pytest.mark.torch
def test_a_checkpoints_write_burst_is_found_in_the_stall_it_caused(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "hpcml", "run", "--ntasks", "2", "--interval", "0.2", "--dir", "job",
                        "--no-report", "--", sys.executable, "train.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = subprocess.run([sys.executable, "-m", "hpcml", "observe", "report", "job/observe", "--json",
                          "--min-stall", "0.3"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    io = doc["io"]
    by_rank = {r["rank"]: r for r in io["ranks"]}
    assert by_rank[0]["write_chars"] >= 4 * 400_000_000                 # four saves of 400 MB, counted
    assert by_rank[1]["write_chars"] < 100_000_000 and by_rank[0]["write_calls"] > 0
    assert doc["stalls"], doc["stalls"]
    saves = [b for b in io["bursts"] if b.get("checkpoint_saves")]
    assert saves and max(b["write_bytes"] or 0 for b in saves) >= 200_000_000, io["bursts"]
    (f,) = [f for f in doc["findings"] if f["kind"] == "io_burst"]
    assert "came with an I/O burst" in f["message"] and "the ranks wrote" in f["message"], f
    assert "checkpoint save(s) blocked the loop" in f["message"]
    assert any(f["kind"] == "io_imbalance" and "rank 0 wrote" in f["message"] for f in doc["findings"])


LUSTRE = """snapshot_time             1700000000.123456789 secs.nsecs
start_time                1699990000.000000000 secs.nsecs
elapsed_time              10000.123456789 secs.nsecs
read_bytes                2048 samples [bytes] 1 4194304 3221225472 5070602400912917605
write_bytes               512 samples [bytes] 4096 4194304 1073741824 2251799813685248
read                      2048 samples [usecs] 3 12000 1500000 1230000000
open                      96 samples [usecs] 10 300 5000 400000
getattr                   1200 samples [usecs] 2 100 20000 600000
"""

MOUNTSTATS = """device sysfs mounted on /sys with fstype sysfs
device proc mounted on /proc with fstype proc
device fs1:/export/home mounted on /home with fstype nfs statvers=1.1
\topts:\trw,vers=3,rsize=1048576,wsize=1048576,namlen=255,acregmin=3,hard,proto=tcp
\tage:\t11343100
\tcaps:\tcaps=0x3fc7,wtmult=512,dtsize=8192,bsize=0,namlen=255
\tsec:\tflavor=1,pseudoflavor=1
\tevents:\t1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27
\tbytes:\t1000 2000 300 400 1300 2400 5 6
\tRPC iostats version: 1.1  p/v: 100003/3 (nfs)
\txprt:\ttcp 0 0 1 0 0 10 10 0 10 0 2 0 0
\tper-op statistics
\t        NULL: 0 0 0 0 0 0 0 0 0

device fs2:/scratch mounted on /scratch with fstype nfs4 statvers=1.1
\tbytes:\t10 20 30 40 50 60 1 1

device fs2:/scratch mounted on /home/u/scratch with fstype nfs4 statvers=1.1
\tbytes:\t10 20 30 40 50 60 1 1

device tmpfs mounted on /tmp with fstype tmpfs
"""


def test_lustre_and_nfs_client_counters_are_read_as_their_producers_print_them(tmp_path):
    assert lustre_bytes(LUSTRE) == (3221225472, 1073741824)
    assert lustre_bytes("snapshot_time 1 secs.nsecs\nopen 3 samples [usecs] 1 2 3 4\n") is None
    assert nfs_bytes(MOUNTSTATS) == (1000 + 300 + 10 + 30, 2000 + 400 + 20 + 40)
    assert nfs_bytes("device tmpfs mounted on /tmp with fstype tmpfs\n") is None
    d = tmp_path / "llite" / "scratch-ffff8" / "stats"
    d.parent.mkdir(parents=True)
    d.write_text(LUSTRE)
    (tmp_path / "mountstats").write_text(MOUNTSTATS)
    got = FsClients((str(tmp_path / "llite" / "*" / "stats"),), str(tmp_path / "mountstats")).sample()
    assert got == {"fs_lustre_read_bytes": 3221225472.0, "fs_lustre_write_bytes": 1073741824.0,
                   "fs_nfs_read_bytes": 1340.0, "fs_nfs_write_bytes": 2460.0}
    assert FsClients((str(tmp_path / "none" / "*"),), str(tmp_path / "missing")).sample() == {}   # a no-op, no zeros


H200 = ROOT / "tests" / "fixtures" / "gpu-h200" / "storage"


def test_an_h200_job_checkpointing_while_it_trains_is_found_in_its_own_recording(tmp_path):
    """The recording of benchmarks/gpu_check.py's storage part on one H200 (kept as it came):
    a model stepping at ~400 steps/s saved 1.70 GB with torch.save every 150 steps, each
    save 2.7-2.9 s by the script's own clock (rank-00000.out). Rebuilt from the rank's store,
    the report finds the three stalls inside the job (the fourth save ended it), each with
    its checkpoint save and its 1.7 GB written."""
    saves = [ln for ln in (H200 / "rank-00000.out").read_text().splitlines() if ln.startswith("saved step")]
    size = int(saves[0].split(", ")[1].split()[0])
    assert len(saves) == 4 and size == 1_700_717_739
    import shutil
    job = Path(shutil.copytree(H200 / "observe", tmp_path / "observe"))     # the report writes its HTML beside it
    rep = subprocess.run([sys.executable, "-m", "hpcml", "observe", "report", str(job), "--json",
                          "--min-stall", "0.3"], env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    bursts = doc["io"]["bursts"]
    assert len(bursts) == 3 and all(b["checkpoint_saves"] == 1 for b in bursts)
    assert all(0.9 * size <= b["write_bytes"] < 1.05 * size for b in bursts), bursts    # the stall starts in its save
    assert doc["io"]["ranks"][0]["write_chars"] >= 4 * size
    (f,) = [f for f in doc["findings"] if f["kind"] == "io_burst"]
    assert "the ranks wrote 1.7 GB" in f["message"] and "(2 more stalls like it)" in f["message"]
