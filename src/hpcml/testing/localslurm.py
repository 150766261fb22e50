"""A real Slurm cluster of virtual nodes on this one host, for tests and benchmarks.

hpcml drives Slurm's own clients, and their behaviour (multi-node steps, drains, prologs,
timeouts) is what its tools must get right, so the suite runs against real slurmctld and
slurmd daemons rather than mocks. Debian's Slurm is built with multiple-slurmd support, so
several ``slurmd -N nK`` on one host make a cluster of N nodes. Everything (munged with its
own key and socket, slurm.conf, state, spool, logs, PID files) lives under one root
directory and uses its own ports, so it never touches ``/etc/slurm``, ``/etc/munge`` or a
developer's other cluster, and ``stop()`` signals only processes it can prove are its own.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from hpcml.cluster import slurm
from hpcml.cluster.hostlist import expand, fold
from hpcml.errors import SlurmError
from hpcml.ports import port_free
from hpcml.proctree import command_line

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path("/tmp/hpcml-slurm")
DEFAULT_CTLD_PORT = 6917  # a block apart from Slurm's defaults (6817-6819) and infra.md's 6821+
DEFAULT_FIRST_SLURMD_PORT = 6921
SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")
BINARY_PACKAGES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "srun": "slurm-client",
                   "munged": "munge"}
EXTRA_PACKAGES = ("libpmix2",)  # without it slurmd logs "mpi/pmix: can not load PMIx library"
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
HOSTS_FILE = Path("/etc/hosts")
CLIENT_TIMEOUT = 5.0  # one sinfo/scontrol/squeue call; clients retry for minutes otherwise
GRACE = 5.0  # between SIGTERM and SIGKILL
APT_TIMEOUT = 1200.0
DAEMONS = ("munged", "slurmctld", "slurmd")


class SlurmNotInstalled(SlurmError):
    """Slurm or munge is missing and this user cannot install them."""


@dataclass
class ClusterStatus:
    """What ``status()`` found: our daemons' PIDs and, if the controller answers, node states."""

    root: Path
    up: bool
    daemons: dict[str, list[int]] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"local slurm at {self.root}: {'up' if self.up else 'down'}"]
        lines += [f"  {name}: {' '.join(map(str, pids)) or '-'}"
                  for name, pids in self.daemons.items()]
        if self.nodes:
            lines.append("  nodes: " + " ".join(f"{n}={s}" for n, s in self.nodes.items()))
        return "\n".join(lines)


# --- packages ---------------------------------------------------------------------------

def find_binary(name: str) -> str | None:
    """``name`` on PATH or in the sbin directories, where Debian puts the daemons."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN_DIRS])
    return shutil.which(name, path=path)


def _deb_installed(package: str) -> bool:
    if not shutil.which("dpkg-query"):
        return True  # not Debian: only the binaries can be checked
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                          capture_output=True, text=True, timeout=30)
    return proc.returncode == 0 and proc.stdout.strip().endswith(" installed")


def missing_packages() -> list[str]:
    """Debian packages to install so that every daemon and client is there."""
    missing = sorted({pkg for binary, pkg in BINARY_PACKAGES.items() if not find_binary(binary)})
    if missing:
        missing += [pkg for pkg in EXTRA_PACKAGES if not _deb_installed(pkg)]
    return missing


def _apt_get(args: Sequence[str]) -> subprocess.CompletedProcess:
    argv = ["apt-get", "-q", "-y", "-o", "DPkg::Lock::Timeout=120", *args]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=APT_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv)}: not done after {APT_TIMEOUT:g} s") from None


def _last_lines(text: str, count: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-count:])


@contextlib.contextmanager
def _services_blocked() -> Iterator[None]:
    """Keep Debian's postinst from starting the system's munge and slurm services."""
    created = False
    if not POLICY_RC_D.exists():
        POLICY_RC_D.write_text("#!/bin/sh\n# hpcml localslurm: no service starts\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
        created = True
    try:
        yield
    finally:
        if created:
            POLICY_RC_D.unlink(missing_ok=True)


def install_packages(packages: Sequence[str]) -> None:
    """``apt-get install`` as root; ``apt-get update`` only if the first attempt fails."""
    args = ["install", "--no-install-recommends", *packages]
    with _services_blocked():
        proc = _apt_get(args)
        if proc.returncode != 0:
            log.info("apt-get install failed (%s); running apt-get update",
                     _last_lines(proc.stderr or proc.stdout, 1))
            update = _apt_get(["update"])
            if update.returncode != 0:
                raise SlurmError(f"apt-get update failed: {_last_lines(update.stderr)}")
            proc = _apt_get(args)
    if proc.returncode != 0:
        raise SlurmError(f"apt-get install {' '.join(packages)} failed: "
                         f"{_last_lines(proc.stderr or proc.stdout)}")


# --- processes ---------------------------------------------------------------------------

def _alive(proc: psutil.Process) -> bool:
    """Running or sleeping; a zombie counts as dead (PID 1 here reaps slowly)."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_dead(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process is gone or a zombie; return those still alive."""
    deadline = time.monotonic() + timeout
    left = [p for p in procs if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _alive(p)]
    return left


def _send(procs: Iterable[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)


def _terminate(procs: list[psutil.Process], grace: float = GRACE) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after ``grace`` seconds."""
    _send(procs, signal.SIGTERM)
    left = _wait_dead(procs, grace)
    if left:
        log.info("SIGKILL after %g s: %s", grace, [p.pid for p in left])
        _kill(left)


def _kill(procs: list[psutil.Process]) -> None:
    _send(procs, signal.SIGKILL)
    left = _wait_dead(procs, GRACE)
    if left:
        raise SlurmError(f"processes survive SIGKILL: {[p.pid for p in left]}")


def _arg_after(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args[:-1]):
        if arg == flag:
            return args[i + 1]
    return None


def _port_owner(port: int) -> str:
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                name = psutil.Process(conn.pid).name() if conn.pid else "?"
                return f" by pid {conn.pid} ({name})"
    return ""


def _answers(address: str | tuple[str, int]) -> bool:
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(address)
        except OSError:
            return False
    return True


# --- the cluster -------------------------------------------------------------------------

class LocalSlurm:
    """N virtual Slurm nodes (``n1``..``nN``) and a controller, all on this host.

    ``node_names``: the nodes' names in slurm.conf's order instead (their number then), for a
    cluster that does not list its nodes alphabetically: Slurm's node order is that file's.
    """

    def __init__(self, root: Path = DEFAULT_ROOT, nodes: int = 2, cpus_per_node: int = 2,
                 extra_conf: str = "", ctld_port: int = DEFAULT_CTLD_PORT,
                 first_slurmd_port: int = DEFAULT_FIRST_SLURMD_PORT,
                 memory_mb: int = 2000, node_names: Sequence[str] = ()) -> None:
        self._names = list(node_names) or [f"n{i}" for i in range(1, nodes + 1)]
        nodes = len(self._names)
        if nodes < 1 or cpus_per_node < 1:
            raise ValueError("nodes and cpus_per_node must be at least 1")
        self.root = Path(root).absolute()
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.extra_conf = extra_conf
        self.ctld_port = ctld_port
        self.first_slurmd_port = first_slurmd_port
        self.memory_mb = memory_mb
        self.timings: dict[str, float] = {}
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.munge_key = self.root / "munge" / "munge.key"
        self.log_dir = self.root / "log"
        self.run_dir = self.root / "run"
        self.prolog_dir = self.root / "prolog"  # prolog.sh runs prolog/enabled if it exists
        if len(str(self.munge_socket)) > 100:
            raise ValueError(f"root {self.root} is too long for a unix socket path")

    # public API

    @property
    def node_names(self) -> list[str]:
        return list(self._names)

    @property
    def ports(self) -> list[int]:
        return [self.ctld_port] + [self.first_slurmd_port + i for i in range(self.nodes)]

    def env(self) -> dict[str, str]:
        """Variables a Slurm client needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A whole environment for a client subprocess: ``base`` without any job's SLURM_*
        variables (they would tie srun to that job), plus ``env()``."""
        base = os.environ if base is None else base
        env = {k: v for k, v in base.items() if not k.startswith("SLURM_")}
        return {**env, **self.env()}

    def install(self) -> list[str]:
        """Install the missing Debian packages (root only); return what was installed."""
        missing = missing_packages()
        if not missing:
            return []
        if os.geteuid() != 0:
            raise SlurmNotInstalled(
                "Slurm/munge are not installed and only root can install them: "
                f"run `apt-get install {' '.join(missing)}` as root")
        if not shutil.which("apt-get"):
            raise SlurmNotInstalled(f"Slurm/munge are missing ({' '.join(missing)}) "
                                    "and there is no apt-get to install them")
        started = time.monotonic()
        install_packages(missing)
        self.timings["install"] = time.monotonic() - started
        still = [b for b in BINARY_PACKAGES if not find_binary(b)]
        if still:
            raise SlurmError(f"installed {' '.join(missing)} but still missing: {' '.join(still)}")
        return missing

    def start(self, timeout: float | None = None) -> None:
        """Start munged, slurmctld and one slurmd per node; return when all nodes are idle.
        ``timeout`` (default: 60 s and 0.2 s a node: each slurmd starts and registers in turn,
        ~65 ms apiece on a 2-core host, so 1,024 nodes need over a minute of it alone).

        A no-op when this cluster is already up with the same configuration; after a crash
        it first removes what is left of the previous run.
        """
        timeout = timeout if timeout is not None else 60 + 0.2 * len(self.node_names)
        self._require_installed()  # and root
        if self.is_up() and self.conf.read_text() == self.render_conf():
            return
        started = time.monotonic()
        # One retry: on a loaded machine a daemon can lose a race at start (a port still in
        # TIME_WAIT, a PID file read while it daemonises) that a second start does not.
        for attempt in (1, 2):
            self.stop()
            self._check_ports()
            try:
                self._launch(time.monotonic() + timeout)
                break
            except SlurmError as exc:
                with contextlib.suppress(SlurmError):
                    self.stop()
                if attempt == 2:
                    raise
                log.warning("local slurm did not start (%s); trying once more", exc)
            except BaseException:
                with contextlib.suppress(SlurmError):
                    self.stop()
                raise
        self.timings["start"] = time.monotonic() - started

    def stop(self) -> None:
        """Cancel all jobs, stop our daemons and kill our leftover job steps."""
        started = time.monotonic()
        if self._controller_answers():
            self._cancel_all_jobs()
        _terminate(self._find("slurmd"))
        self._kill_steps()
        _terminate(self._find("slurmctld"))
        _terminate(self._find("munged"))
        for pid_file in self.run_dir.glob("*.pid"):
            pid_file.unlink(missing_ok=True)
        self.munge_socket.unlink(missing_ok=True)
        self.timings["stop"] = time.monotonic() - started

    def is_up(self) -> bool:
        """Every daemon of ours runs and the controller answers."""
        daemons = self._daemon_pids()
        if not daemons["munged"] or not daemons["slurmctld"]:
            return False
        if any(not daemons[f"slurmd {n}"] for n in self.node_names):
            return False
        return self._controller_answers()

    def status(self) -> ClusterStatus:
        up = self.is_up()
        nodes = self._sinfo_states() if up else {}
        return ClusterStatus(self.root, up, self._daemon_pids(), nodes)

    def wait_idle(self, timeout: float = 30) -> None:
        """Wait until every node is ``idle``; fail early if slurmctld dies."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            if not self._find("slurmctld"):
                raise SlurmError(f"slurmctld is not running: {self._log_tail('slurmctld')}")
            states = self._sinfo_states()
            if states and all(states.get(n) == "idle" for n in self.node_names):
                return
            time.sleep(0.1)
        raise SlurmError(f"nodes not idle after {timeout:g} s: {states or 'no answer'}; "
                         f"slurmd log: {self._log_tail(f'slurmd-{self.node_names[0]}')}")

    def render_conf(self) -> str:
        """The whole slurm.conf of this cluster (based on notes/infra.md, section 2)."""
        r = self.root
        host = socket.gethostname().split(".")[0]
        lines = [
            "# written by hpcml.testing.localslurm; rewritten at every start",
            "ClusterName=hpcmllocal",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},{self._credential_life()}",
            f"SlurmctldPort={self.ctld_port}", f"SlurmdPort={self.first_slurmd_port}",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={self.run_dir}/slurmctld.pid",
            f"SlurmdPidFile={self.run_dir}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log",
            f"SlurmdLogFile={self.log_dir}/slurmd-%n.log",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            f"PlugStackConfig={r}/etc/plugstack.conf",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "ReturnToService=2", "SlurmdParameters=config_overrides",
            # a pending job that no event starts (a requeued one once its cred_expire delay
            # is over, the first job after slurmctld starts) waits for the next backfill or
            # periodic main pass: by default every 30 s (bf_interval) and 60 s (sched_interval),
            # so a requeue test waited 11 to 41 s for its second attempt; once a second here
            "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_interval=1",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/linux", "JobAcctGatherFrequency=5",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={self.log_dir}/jobcomp.txt",
            "MailProg=/bin/true",
            f"Prolog={self.prolog_dir}/prolog.sh", "PrologFlags=Alloc",
            "SlurmctldTimeout=10", *self._slurmd_timeout(), "KillWait=2", "Waittime=0",
            "InactiveLimit=0", "MinJobAge=300",
            *self._scale_lines(),
            *self._node_lines(host),
        ]
        if self.extra_conf.strip():
            lines += ["# extra_conf", self.extra_conf.strip()]
        return "\n".join(lines) + "\n"

    @property
    def munge_threads(self) -> int:
        return min(64, max(2, self.nodes // 8))

    def _slurmd_timeout(self) -> list[str]:
        return [] if self.nodes > 256 and "SlurmdTimeout" not in self.extra_conf else ["SlurmdTimeout=15"]

    def _credential_life(self) -> str:
        """``cred_expire``: a requeued job waits this long (+1 s) before it may start again;
        10 s (Slurm's default 120 s would make a requeue test wait two minutes), but a step's
        credential also expires then, and past 64 virtual nodes on two cores a step takes
        longer than that to launch ("Job credential expired" on 67 of 512 nodes): 600 s there.
        Past 256 nodes a MUNGE credential lives 30 minutes (its default 300 s ran out in a
        1,024-node launch: "Protocol authentication error"). Made late enough, as a real
        cluster's launch would be quick."""
        life = "cred_expire=10" if self.nodes <= 64 else "cred_expire=600"
        return life + (",ttl=1800" if self.nodes > 256 else "")

    def _scale_lines(self) -> list[str]:
        """Beyond 64 virtual nodes on one host, a step launch keeps the host's CPUs busy for
        tens of seconds, and Slurm's 10 s MessageTimeout fails node messages ("Socket timed
        out on send/recv operation") that a real node of its own would answer at once; beyond
        256, for minutes (its credentials then live longer)."""
        if self.nodes <= 64 or "MessageTimeout" in self.extra_conf:
            return []
        if self.nodes <= 256 or "SlurmdTimeout" in self.extra_conf:
            return ["MessageTimeout=60"]
        # the batch node's slurmd, busy with a 512-task launch on two cores, answered no ping
        # for 15 s: Slurm took it for failed and requeued the job
        return ["MessageTimeout=60", "SlurmdTimeout=300"]

    def _node_lines(self, host: str) -> list[str]:
        """One line per virtual node, each slurmd on its own port, and one partition."""
        lines = [f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                 f"CPUs={self.cpus_per_node} RealMemory={self.memory_mb} State=UNKNOWN"
                 for name, port in zip(self.node_names, self.ports[1:], strict=True)]
        return lines + [f"PartitionName=debug Nodes={fold(self.node_names)} Default=YES "
                        "MaxTime=INFINITE State=UP"]

    def __enter__(self) -> LocalSlurm:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # starting

    def _require_installed(self) -> None:
        missing = [b for b in BINARY_PACKAGES if not find_binary(b)]
        if missing:
            raise SlurmNotInstalled(f"not installed: {' '.join(missing)}; run install() "
                                    "(or `python -m hpcml.testing.localslurm start`) as root")
        if os.geteuid() != 0:
            raise SlurmError("the local cluster runs its daemons as root (SlurmUser=root); "
                             "start it as root")

    def _check_ports(self) -> None:
        for port in self.ports:
            if not port_free("0.0.0.0", port, reuse=True):
                raise SlurmError(f"port {port} is in use{_port_owner(port)}; choose other "
                                 "ports (ctld_port, first_slurmd_port) or stop that process")

    def _launch(self, deadline: float) -> None:
        self._prepare_dirs()
        self._ensure_hosts()
        self._start_munged(deadline)
        self.conf.write_text(self.render_conf())
        self._start_slurmctld(deadline)
        for name in self.node_names:
            self._run_daemon(f"slurmd-{name}", [find_binary("slurmd") or "slurmd",
                                                "-N", name, "-f", str(self.conf)])
        self.wait_idle(max(deadline - time.monotonic(), 1.0))

    def _prepare_dirs(self) -> None:
        """Fresh state, spool and run dirs; the old logs go, so a log shows one run only."""
        for sub in ("state", "spool", "run", "log", "munge", "prolog"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        for sub in ("etc", "state", "run", "log", "munge", "prolog",
                    *(f"spool/{n}" for n in self.node_names)):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o755)
        for path in (self.root, self.root / "munge"):
            path.chmod(0o755)  # munged refuses directories that others can write to
        (self.root / "etc" / "plugstack.conf").write_text("")
        script = self.prolog_dir / "prolog.sh"  # a test enables it by writing prolog/enabled
        script.write_text(f"#!/bin/sh\n[ -f {self.prolog_dir}/enabled ] || exit 0\n"
                          f"exec /bin/sh {self.prolog_dir}/enabled\n")
        script.chmod(0o755)
        fd = os.open(self.munge_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as key:
            key.write(os.urandom(1024))

    def _ensure_hosts(self) -> None:
        """Make the node names resolve to 127.0.0.1: other tools connect to them."""
        missing = [n for n in self.node_names if not _resolves(n)]
        if not missing:
            return
        if os.geteuid() != 0:
            log.warning("node names %s do not resolve; add them to %s", missing, HOSTS_FILE)
            return
        with HOSTS_FILE.open("a") as hosts:
            hosts.write(f"127.0.0.1 {' '.join(missing)}  # hpcml localslurm\n")

    def _start_munged(self, deadline: float) -> None:
        munge_dir = self.root / "munge"
        self._run_daemon("munged", [
            find_binary("munged") or "munged", f"--socket={self.munge_socket}",
            f"--key-file={self.munge_key}", f"--pid-file={self.run_dir}/munged.pid",
            f"--log-file={self.log_dir}/munged.log", f"--seed-file={munge_dir}/munged.seed",
            # one munged serves every virtual node's slurmd and slurmstepd here (a real
            # cluster has one per node): with its default 2 threads, a 256-node step launch
            # fails with "Munge encode failed: Resource temporarily unavailable"
            f"--num-threads={self.munge_threads}"])
        self._wait_for(lambda: _answers(str(self.munge_socket)), "munged", deadline)
        self._favour("munged")

    def _favour(self, daemon: str) -> None:
        """Beyond 64 virtual nodes, raise a shared daemon's CPU priority (root only): while
        hundreds of tasks start on two cores it must still drain its socket's backlog (256
        for munged), or credentials fail with EAGAIN; each real node has its own."""
        if self.nodes <= 64 or os.geteuid() != 0:
            return
        # the daemon answers before it rewrites its PID file (a stale one names the last
        # cluster's daemon): wait a little for a PID whose command is this daemon
        pid_file = self.run_dir / f"{daemon}.pid"
        problem: Exception | None = None
        for _ in range(25):
            try:
                pid = int(pid_file.read_text().split()[0])
                if daemon.encode() in command_line(pid):
                    for task in os.listdir(f"/proc/{pid}/task"):   # setpriority is per thread
                        os.setpriority(os.PRIO_PROCESS, int(task), -10)
                    return
                problem = ProcessLookupError(f"PID {pid} in {pid_file} is not {daemon}")
            except (OSError, ValueError, IndexError) as exc:
                problem = exc
            time.sleep(0.2)
        log.warning("could not raise %s's priority: %s", daemon, problem)

    def _start_slurmctld(self, deadline: float) -> None:
        self._run_daemon("slurmctld", [find_binary("slurmctld") or "slurmctld",
                                       "-f", str(self.conf)])
        self._wait_for(lambda: _answers(("127.0.0.1", self.ctld_port)), "slurmctld", deadline)
        self._favour("slurmctld")

    def _run_daemon(self, name: str, argv: list[str]) -> None:
        """Run a daemon that detaches itself; its early output goes to ``log/NAME.out``."""
        with (self.log_dir / f"{name}.out").open("ab") as out:
            try:
                proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, env=self._daemon_env(),
                                      cwd=self.root, timeout=30, start_new_session=True)
            except subprocess.TimeoutExpired:
                raise SlurmError(f"{name} did not detach within 30 s") from None
        if proc.returncode != 0:
            raise SlurmError(f"{name} failed to start (exit {proc.returncode}): "
                             f"{self._log_tail(name)}")

    def _wait_for(self, ready: Callable[[], bool], name: str, deadline: float,
                  gone_for: float = 2.0) -> None:
        """Wait until ``ready()``; a daemon is taken for exited only once it has been absent
        from the process table for ``gone_for`` seconds (while it daemonises, between the
        parent's exit and the child's PID file, a scan can miss it on a loaded machine)."""
        missing_since: float | None = None
        while not ready():
            now = time.monotonic()
            if now > deadline:
                raise SlurmError(f"{name} not ready in time: {self._log_tail(name)}")
            if self._find(name):
                missing_since = None
            elif missing_since is None:
                missing_since = now
            elif now - missing_since > gone_for and not ready():
                raise SlurmError(f"{name} exited at start: {self._log_tail(name)}")
            time.sleep(0.02)

    def _daemon_env(self) -> dict[str, str]:
        """Daemons and their slurmstepd carry our SLURM_CONF: that is how stop() finds steps."""
        return self.client_env()

    def _log_tail(self, name: str, count: int = 3) -> str:
        texts = []
        for path in (self.log_dir / f"{name}.log", self.log_dir / f"{name}.out"):
            with contextlib.suppress(OSError):
                texts.append(path.read_text(errors="replace"))
        tail = _last_lines("\n".join(texts), count)
        return f"{tail or 'no log'} (logs in {self.log_dir})"

    # stopping

    def _cancel_all_jobs(self) -> None:
        """scancel every job and give them up to 10 s to end. A job with a node whose slurmd
        is gone (a test killed it) cannot end until Slurm calls that node down: it is not
        waited for (``stop()`` kills what is left of its steps all the same)."""
        jobs = self._client(["squeue", "-h", "-o", "%A"])
        if not jobs:
            return
        self._client(["scancel", *jobs])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.1)
            lines = slurm.run(["squeue", "-h", "-o", "%A %N"], timeout=CLIENT_TIMEOUT,
                              env=self.client_env()).stdout.splitlines()
            left = [line.split()[1:] for line in lines if line.strip()]      # a pending job: no nodes
            if not left:
                return
            alive: set[str | None] = set()
            for proc in self._find("slurmd"):
                with contextlib.suppress(psutil.Error):
                    alive.add(_arg_after(proc.cmdline(), "-N"))
            if all(nodes and not set(expand(nodes[0])) <= alive for nodes in left):
                return

    def _kill_steps(self) -> None:
        """SIGKILL our slurmstepd processes and whatever tasks they still have. Each is
        stopped (SIGSTOP) before its children are listed again, until no new one appears:
        a task forking while it is listed (a batch script starting its ``srun``) would
        otherwise leave the child it was making alive, re-parented and out of reach."""
        steps = self._find("slurmstepd")
        found: dict[int, psutil.Process] = {p.pid: p for p in steps}
        parents = list(steps)
        try:
            for _ in range(20):
                for proc in parents:                      # a stopped process forks nothing more
                    with contextlib.suppress(psutil.Error):
                        proc.send_signal(signal.SIGSTOP)
                new: list[psutil.Process] = []
                for proc in list(found.values()):
                    with contextlib.suppress(psutil.Error):
                        new += [c for c in proc.children(recursive=True) if c.pid not in found]
                for c in new:
                    found[c.pid] = c
                if not new:
                    break
                parents = new
        finally:                                          # whatever was stopped is killed, come what may
            tasks = [p for pid, p in found.items() if pid not in {s.pid for s in steps}]
            if steps or tasks:
                log.info("killing leftover steps %s and tasks %s",
                         [p.pid for p in steps], [p.pid for p in tasks])
                _kill(steps + tasks)

    # finding our processes

    def _find(self, role: str) -> list[psutil.Process]:
        """Our live processes of one role (munged, slurmctld, slurmd, slurmd-nK, slurmstepd).

        PID files come first; a scan of all processes finds those whose PID file is gone.
        Either way a process counts only if its command line names our socket or our
        slurm.conf (for slurmstepd: its SLURM_CONF), so a reused PID is never signalled.
        """
        binary, _, node = role.partition("-")
        found = {p.pid: p for p in self._from_pid_files(binary) if self._is_ours(p, binary, node)}
        for proc in psutil.process_iter():
            if proc.pid not in found and self._is_ours(proc, binary, node):
                found[proc.pid] = proc
        return [p for p in found.values() if _alive(p)]

    def _from_pid_files(self, binary: str) -> list[psutil.Process]:
        procs = []
        for pid_file in self.run_dir.glob(f"{binary}*.pid"):
            # a daemon writes its pid file after creating it: an empty one is not yet a pid
            with contextlib.suppress(OSError, ValueError, IndexError, psutil.Error):
                procs.append(psutil.Process(int(pid_file.read_text().split()[0])))
        return procs

    def _is_ours(self, proc: psutil.Process, binary: str, node: str = "") -> bool:
        try:
            if proc.name() != binary:
                return False
            if binary == "slurmstepd":
                return self._step_is_ours(proc)
            args = proc.cmdline()
        except psutil.Error:
            return False
        if binary == "munged":
            return f"--socket={self.munge_socket}" in args
        if node and _arg_after(args, "-N") != node:
            return False
        return _arg_after(args, "-f") == str(self.conf)

    def _step_is_ours(self, proc: psutil.Process) -> bool:
        """A slurmstepd of ours has our SLURM_CONF or keeps one of our slurmd logs open.

        slurmstepd writes its process title ("slurmstepd: [5.0]") over the memory that
        held its environment, so /proc/PID/environ is usually blank; its open log file
        (our SlurmdLogFile) still names the cluster it belongs to.
        """
        if proc.environ().get("SLURM_CONF") == str(self.conf):
            return True
        return any(Path(f.path).parent == self.log_dir for f in proc.open_files())

    def _daemon_pids(self) -> dict[str, list[int]]:
        roles = ["munged", "slurmctld", *(f"slurmd {n}" for n in self.node_names)]
        return {role: [p.pid for p in self._find(role.replace(" ", "-"))] for role in roles}

    # talking to the controller

    def _client(self, argv: list[str], timeout: float = CLIENT_TIMEOUT) -> list[str]:
        return slurm.run(argv, timeout=timeout, env=self.client_env()).stdout.split()

    def _controller_answers(self) -> bool:
        if not self._find("slurmctld") or not slurm.available("scontrol"):
            return False
        try:
            proc = slurm.run(["scontrol", "ping"], timeout=CLIENT_TIMEOUT,
                             env=self.client_env(), check=False)
        except SlurmError:
            return False
        return "is UP" in proc.stdout

    def _sinfo_states(self) -> dict[str, str]:
        """Node -> sinfo's short state (``idle``, ``mix``, ``drain``, ``down*``...)."""
        try:
            words = self._client(["sinfo", "-h", "-N", "-o", "%N %t"])
        except SlurmError:
            return {}
        return dict(zip(words[::2], words[1::2], strict=False))


def _resolves(name: str) -> bool:
    try:
        socket.gethostbyname(name)
    except OSError:
        return False
    return True


# --- command line ---------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpcml.testing.localslurm",
        description="A local Slurm cluster of virtual nodes (n1..nN) on this host.",
        epilog='example: python -m hpcml.testing.localslurm start && '
               'eval "$(python -m hpcml.testing.localslurm env)" && srun -N2 hostname')
    parser.add_argument("action", choices=["start", "stop", "status", "env"])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus-per-node", type=int, default=2)
    parser.add_argument("--ctld-port", type=int, default=DEFAULT_CTLD_PORT)
    parser.add_argument("--first-slurmd-port", type=int, default=DEFAULT_FIRST_SLURMD_PORT)
    parser.add_argument("--extra-conf", default="", help="lines appended to slurm.conf")
    parser.add_argument("--node-names", default="", help="the nodes in slurm.conf's order, a hostlist "
                        "(n[4,1-3]): instead of --nodes' n1..nN")
    parser.add_argument("--timeout", type=float, default=None, help="start: seconds to wait (default: 60 and 0.2 a node)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cluster = LocalSlurm(args.root, args.nodes, args.cpus_per_node, args.extra_conf,
                         args.ctld_port, args.first_slurmd_port, node_names=expand(args.node_names))
    try:
        if args.action == "start":
            cluster.install()
            cluster.start(args.timeout)
            print(cluster.status())
        elif args.action == "stop":
            cluster.stop()
        elif args.action == "status":
            status = cluster.status()
            print(status)
            return 0 if status.up else 3
        else:
            for key, value in cluster.env().items():
                print(f"export {key}={shlex.quote(value)}")
    except SlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if cluster.timings:
        log.info("timings: %s", ", ".join(f"{k} {v:.2f} s" for k, v in cluster.timings.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
