"""The launch lines hpcml recognises (``hpcml.run.launchers``) and the task wrapper's key
server for a launcher's workers (``hpcml.run.workerkeys``): real processes, real sockets."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcml.run import launchers
from hpcml.run.inject import sitecustomize as site
from hpcml.run.launchers import recognise
from hpcml.run.workerkeys import KeyServer, ask


@pytest.mark.parametrize(("cmd", "name", "workers"), [
    (["torchrun", "--standalone", "--nproc-per-node", "4", "train.py", "--nproc-per-node", "9"], "torchrun", 4),
    (["/opt/venv/bin/torchrun", "--nproc_per_node=2", "--nnodes", "3", "train.py"], "torchrun", 2),
    (["torchrun", "train.py"], "torchrun", 1),                                     # torchrun's default
    (["torchrun", "--nproc-per-node", "auto", "train.py"], "torchrun", None),      # the host's to say
    (["python3", "-m", "torch.distributed.run", "--nproc-per-node", "8", "-m", "pkg.train"], "torchrun", 8),
    (["accelerate", "launch", "--multi_gpu", "--num_processes", "8", "--num_machines", "2", "t.py"], "accelerate", 4),
    (["accelerate", "launch", "t.py"], "accelerate", None),                        # its config file's
    (["accelerate", "launch", "--cpu", "--num_processes", "2", "t.py"], "accelerate", None),   # one process
    (["torchrun", "--standalone", "--virtual-local-rank", "--nproc-per-node", "2", "t.py"], "torchrun", 2),
    (["torchrun", "--nproc_per", "3", "t.py"], "torchrun", 3),                   # argparse's prefix
    (["torchrun", "--no-python", "--nproc-per-node", "2", "sleep", "9"], "torchrun", None),   # nothing to wrap
    (["accelerate", "launch", "--multi-gpu", "--num-processes", "4", "--downcast_bf16", "t.py", "--num_processes",
      "8"], "accelerate", 4),                                                     # the script's own options: not read
])
def test_a_launch_line_is_recognised_with_its_workers_per_task(cmd, name, workers):
    launch = recognise(cmd)
    assert launch is not None and (launch.name, launch.workers) == (name, workers)


@pytest.mark.parametrize("cmd", [["python", "train.py"], ["srun", "torchrun", "t.py"], ["accelerate", "config"],
                                 ["python", "-m", "torch.distributed.launch2"], []])
def test_a_plain_program_is_not_a_launcher(cmd):
    assert recognise(cmd) is None


def test_the_rendezvous_is_given_only_where_the_line_and_the_environment_leave_it():
    env = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "4242"}
    line = recognise(["torchrun", "--nproc-per-node", "2", "--master-port", "29999", "t.py"])
    assert line is not None
    assert line.rendezvous_env(env) == {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "n1"}
    assert line.rendezvous_env({**env, "PET_MASTER_ADDR": "mine"}) == {"PET_NNODES": "2", "PET_NODE_RANK": "1"}
    own = recognise(["torchrun", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--nproc-per-node", "2", "t.py"])
    assert own is not None and own.rendezvous_env(env) == {"PET_NNODES": "2"}      # its node ranks are its own
    alone = recognise(["torchrun", "--standalone", "--nproc-per-node", "2", "t.py"])
    assert alone is not None and alone.rendezvous_env(env) == {}


def test_torchruns_count_from_its_environment_is_read():
    launch = recognise(["torchrun", "--standalone", "t.py"], env={"PET_NPROC_PER_NODE": "4"})
    assert launch is not None and launch.workers == 4


def test_the_sitecustomize_names_the_same_variables_as_the_launchers_module():
    """sitecustomize imports nothing of hpcml: its copies must not drift."""
    assert (site.LAUNCHER, site.WRAPPED, site.IN_RANK, site.IDENTITY) == (
        launchers.ENV_LAUNCHER, launchers.ENV_WRAPPED, launchers.ENV_IN_RANK, launchers.IDENTITY)


INJECT = str(Path(site.__file__).parent)
WORKER_ENV = {"HPCML_RUN_LAUNCHER": "torchrun", "HPCML_RUN_WRAPPED": "0|1|0||0", "RANK": "1", "WORLD_SIZE": "2",
              "LOCAL_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "0"}


def _started(code: list[str], **env: str) -> subprocess.CompletedProcess:
    """A Python process started as a launcher starts its worker: hpcml's sitecustomize first on
    PYTHONPATH, the launcher's rank variables, and no HPCML_RUN_WORKER (a wrapped worker's
    recorder would fail on that at once, so a process that runs its own code was not wrapped)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HPCML_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    full.update({"PYTHONPATH": INJECT, **WORKER_ENV, **env})
    return subprocess.run([sys.executable, *code], env=full, capture_output=True, text=True, timeout=60)


def test_a_launchers_worker_is_wrapped_and_what_runs_below_a_rank_is_not():
    wrapped = _started(["-c", "print('ran')"])
    assert "ran" not in wrapped.stdout and "HPCML_RUN_WORKER" in wrapped.stderr    # hpcml.run.worker started
    below = _started(["-c", "print('ran')"], HPCML_RUN_IN_RANK="1")              # a worker's own subprocess
    assert below.stdout.strip() == "ran", below.stderr
    same = _started(["-c", "print('ran')"], HPCML_RUN_WRAPPED="1|2|1||0")         # the rank's own process
    assert same.stdout.strip() == "ran", same.stderr


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_multiprocessing_children_of_a_worker_are_never_wrapped(method, tmp_path):
    """``multiprocessing``'s spawn or forkserver children whose rank variables differ from the
    wrapped process's (a framework rewrote LOCAL_RANK; torchrun's own function workers):
    their descriptors are passed by number, so they run as multiprocessing starts them."""
    code = (f"import multiprocessing as mp\nimport os\ndef f(q):\n    q.put(os.getpid())\n"
            f"if __name__ == '__main__':\n    os.environ['LOCAL_RANK'] = '7'\n"      # the child's variables differ
            f"    ctx = mp.get_context({method!r})\n    q = ctx.Queue()\n"
            f"    p = ctx.Process(target=f, args=(q,))\n    p.start()\n    print('child', q.get(timeout=30))\n"
            f"    p.join()\n")
    (tmp_path / "mp_child.py").write_text(code)
    got = _started([str(tmp_path / "mp_child.py")], HPCML_RUN_WRAPPED="1|2|1||0")    # the rank's own process
    assert got.stdout.startswith("child "), got.stderr


def test_an_interpreter_without_hpcmls_worker_runs_the_program_unwatched(tmp_path):
    (tmp_path / "hpcml").mkdir()
    (tmp_path / "hpcml" / "__init__.py").write_text("")                   # an older hpcml, or a namesake
    got = _started(["-c", "print('ran')"], PYTHONPATH=f"{INJECT}:{tmp_path}")
    assert got.stdout.strip() == "ran", got.stderr


ASK = "import sys; from hpcml.run.workerkeys import ask; k = ask(sys.argv[1]); print(k.hex() if k else 'none')"


def _ask(name: str, rank: str | None, **kw) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RANK"} | ({"RANK": rank} if rank is not None else {})
    return subprocess.run([sys.executable, "-c", ASK, name], env=env, capture_output=True, text=True,
                          timeout=60, check=True, **kw).stdout.strip()


def test_a_worker_of_this_task_gets_the_key_of_the_rank_it_was_started_with():
    server = KeyServer(lambda r: bytes([r]) * 32, world=4)
    try:
        assert _ask(server.name, "3") == (bytes([3]) * 32).hex()
        assert _ask(server.name, "4") == "none"             # not a rank of the launcher's world
        assert _ask(server.name, None) == "none"            # no rank at all
        assert ask(server.name) is None                     # this process: not a descendant of itself
    finally:
        server.close()


def test_a_ranks_key_goes_to_one_live_worker_at_a_time():
    """A second process asking for rank 1's key while the first holder runs is refused; once
    that one is gone (torchrun restarted its workers), the next one gets it."""
    server = KeyServer(lambda r: bytes([r]) * 32, world=4)
    try:
        hold = ASK.replace("print(k.hex() if k else 'none')", "print(k.hex() if k else 'none', flush=True)")
        holder = subprocess.Popen([sys.executable, "-c", hold + "; import time; time.sleep(60)", server.name],
                                  env={**os.environ, "RANK": "1"}, stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == (bytes([1]) * 32).hex()
        assert _ask(server.name, "1") == "none"
        holder.kill()
        holder.wait()
        assert _ask(server.name, "1") == (bytes([1]) * 32).hex()
    finally:
        server.close()


def test_a_launcher_task_defaults_to_one_per_node_not_one_per_gpu():
    from hpcml.run.backends import _launches
    assert _launches(["python", "-m", "hpcml.run.task", "d", "--", "torchrun", "--nproc-per-node", "4", "t.py"])
    assert not _launches(["python", "-m", "hpcml.run.task", "d", "--", "python", "t.py"])
    assert not _launches(["python", "-m", "hpcml.run.task", "d", "--", "torchrun", "--nproc-per-node", "auto", "t.py"])


def test_a_process_outside_the_task_gets_no_key(tmp_path):
    """Orphaned at once (its parent exits), the asker is no descendant of the wrapper."""
    server = KeyServer(lambda r: b"k" * 32, world=4)
    out = tmp_path / "out"
    try:
        code = (f"import os, sys\nif os.fork(): os._exit(0)\nimport time; time.sleep(0.5)\n"
                f"from hpcml.run.workerkeys import ask\nk = ask({server.name!r})\n"
                f"open({str(out)!r}, 'w').write(k.hex() if k else 'none')\n")
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "RANK": "1"}, check=True, timeout=60)
        deadline = time.time() + 30
        while not out.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert out.read_text() == "none"
    finally:
        server.close()


@pytest.fixture
def other_user():
    name = "hpcmlkeys"
    if os.geteuid() != 0:
        pytest.fail("the multi-user test needs root (useradd): CI runs as root")
    subprocess.run(["useradd", "-M", name], capture_output=True)
    yield name


@pytest.mark.machine                                # useradd: /etc/passwd's lock, beside test_proof_slurm's users
def test_another_users_process_gets_no_key(other_user):
    """A real second Unix user, started by this process (so a descendant): refused by uid.
    The system's python3 (the checkout's venv may not be theirs to read), asking as
    ``ask`` does, in a few lines of its own."""
    server = KeyServer(lambda r: b"k" * 32, world=4)
    raw = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect('\\0' + sys.argv[1])\n"
           "print(s.recv(256).decode() or 'none')\n")
    try:
        p = subprocess.run(["runuser", "-u", other_user, "--", "env", "RANK=1", "/usr/bin/python3", "-c", raw, server.name],
                           capture_output=True, text=True, timeout=60, cwd="/")
        assert p.stdout.strip() == "none", p.stderr
    finally:
        server.close()
