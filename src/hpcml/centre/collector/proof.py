"""Who sent a job summary or a vetting report, and whether the job or node is theirs:
proven by the cluster, never taken from what was sent.

A summary's ``user`` field is what its sender says. What the collector stores as the user
is what it can prove:

- **MUNGE** (``auth.munge``): a credential made by the job's uid with the local munged,
  whose payload is the SHA-256 digest of the summary without its ``auth`` (``digest``).
  munged on the collector's host decodes it (same key as Slurm's), which proves the uid
  and refuses a replayed, expired or forged credential; a digest that differs means the
  credential vouches for another summary.
- **A user token** (``--job-token-file`` line ``user:token``): for sites without MUNGE.
- **A trusted token** (``--trusted-token-file``): the centre's own tools (an import); its
  summaries are taken as they are. The write token (``--token-file``, which job scripts
  need for ``hpcml vet --report-to``) proves no one.

A user-proven summary of a Slurm job is then checked against Slurm's own records
(``hpcml.cluster.jobrecord``): the job exists, belongs to that uid, ran on every node the
summary names, and was not requeued fewer times than the summary says. A summary that
fails is refused (403) and can never shadow the job's own. A summary nothing proves is
stored as unverified: it is shown, but never counts in a rule or a per-user total, and
the job's verified summary replaces it.

Vetting reports climb the same ladder (``prove_report``), and their proof is the strength
of their evidence, which decides what the node handler may do with them:

- ``node``: a MUNGE credential made by root or by SlurmUser (a prolog, a health check)
  on the very node the report is about (the credential's origin address is one of the
  node's addresses as Slurm knows them, ``NodeAddr``), or a trusted token. Drains and
  resumes by the catalogue's check rules.
- ``job``: a user's report (``hpcml vet``, ``hpcml run --vet``), proven by the user's MUNGE
  credential or user token, of a job Slurm says is theirs, on nodes it held, at a time it
  ran. Counted by people: a rule takes it only with ``match.users``, from that many users.
- ``none``: only the shared write token backs it. Stored and shown, never drains, resumes
  or spends the drain budget.
"""

from __future__ import annotations

import hashlib
import math
import pwd
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from hpcml.centre.summaries import Proven
from hpcml.centre.summaries import Received as JobSummary
from hpcml.cluster import jobrecord, munge
from hpcml.cluster.jobrecord import JobRecord
from hpcml.errors import SlurmError

AUTH_KEY = "auth"
MAX_RESTARTS_IN_ALLOCATION = 1000     # attempts a job may add inside one allocation (--max-restarts)
SLACK_S = 300.0                       # clocks of the job's node, slurmctld and the collector differ
ASK_SLURM_AT_ONCE = 4                 # Slurm lookups in flight; the other request threads stay free
ASK_WAIT_S = 2.0


class Forbidden(Exception):
    """The summary claims what the cluster denies: refused, 403."""


class Unavailable(Exception):
    """munged or Slurm cannot be asked now: 503, the sender keeps the summary and retries."""


class Unproven(Exception):
    """A credential someone else used first (a replay): 401, the sender makes a new one."""


def digest(item: Mapping[str, Any]) -> bytes:
    """The SHA-256 of a summary as sent, without its ``auth``: keys sorted, orjson's
    number forms (what the collector's parse gives back, byte for byte)."""
    body = {k: v for k, v in item.items() if k != AUTH_KEY}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).digest()


def credential(summary: Mapping[str, Any], socket: str | None = None) -> dict[str, str] | None:
    """``auth`` for a summary, made by this process's uid; None where MUNGE is not there
    (the summary then travels unproven, or proven by a user token)."""
    if not munge.available():
        return None
    try:
        return {"munge": munge.encode(digest(summary), socket)}
    except munge.MungeError:
        return None


@dataclass(frozen=True)
class Sender:
    """What the request's token says about who sent it."""

    trusted: bool = False          # a trusted token: the centre's own tools
    user: str | None = None        # a user token's user


@dataclass(frozen=True)
class Proof:
    how: Literal["munge", "token", "trusted", "none"]
    user: str | None = None
    uid: int | None = None
    job: str = "unchecked"         # slurm (Slurm's records agree) | unchecked | not-a-slurm-job

    @property
    def verified(self) -> bool:
        """Counts in rules and per-user totals: a trusted token's, or a proven user's job that
        Slurm's records confirm (or any proven user's where the site turned Slurm checks off)."""
        return self.how == "trusted" or (self.how in ("munge", "token") and self.job in ("slurm", "unchecked"))

    def stored(self) -> Proven:
        return Proven(how=self.how, user=self.user, uid=self.uid, verified=self.verified)


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


_UIDS: dict[str, tuple[float, int | None]] = {}


def _uid(user: str) -> int | None:
    """A user name's uid on this host (as Slurm's hosts share users), so that one person
    proven by MUNGE and by a token counts once. Kept a minute: a name service lookup per
    summary (~0.1 ms for a name it does not know) was a tenth of a request's cost."""
    now = time.monotonic()
    hit = _UIDS.get(user)
    if hit is not None and now - hit[0] < 60:
        return hit[1]
    try:
        uid: int | None = pwd.getpwnam(user).pw_uid
    except (KeyError, TypeError, ValueError):
        uid = None
    if len(_UIDS) > 10_000:
        _UIDS.clear()
    _UIDS[user] = (now, uid)
    return uid


def person(uid: int | None, user: str | None) -> str:
    """One key per person, whichever proof they sent (their MUNGE credential, their token):
    ``uid:N`` where the uid is known (Slurm's record first), else ``user:NAME``: what the
    node handler counts users by, as job events name their owners."""
    return f"uid:{uid}" if uid is not None else f"user:{user}"


Evidence = Literal["node", "job", "none"]


@dataclass(frozen=True)
class ReportProof:
    """How strong a vetting report is as evidence about its nodes, and who proved it."""

    evidence: Evidence
    sender: str | None = None       # the proven user (job evidence) or root/SlurmUser (node)


def node_addresses(node: str, timeout: float = 10.0) -> frozenset[str] | None:
    """The IPv4 addresses of ``node`` as Slurm knows it (``NodeAddr``, resolved); None when
    Slurm has no such node. ``SlurmError`` when Slurm cannot be asked."""
    import socket

    from hpcml.cluster import slurm
    try:
        recs = slurm.scontrol_show("node", node, timeout=timeout)
    except SlurmError as exc:
        if "not found" in str(exc).lower() or "invalid node name" in str(exc).lower():
            return None
        raise
    rec = next((r for r in recs if r.get("NodeName") == node), None)
    if rec is None:
        return None
    addr = rec.get("NodeAddr") or node
    try:
        infos = socket.getaddrinfo(addr, None, socket.AF_INET)
    except OSError:
        return frozenset({addr})
    return frozenset(str(i[4][0]) for i in infos)


def slurm_uid(config: Mapping[str, str]) -> int | None:
    """SlurmUser's uid from ``scontrol show config`` (``SlurmUser = slurm(64030)``)."""
    value = config.get("SlurmUser", "")
    _, _, rest = value.partition("(")
    return int(rest.rstrip(")")) if rest.rstrip(")").isdigit() else None


def _theirs(rec: JobRecord | None, job_id: str, uid: int | None, user: str | None, nodes: set[str],
            key: str) -> JobRecord:
    """Slurm's record of ``job_id`` when it is the sender's job and held ``nodes``, else
    ``Forbidden`` (``key``: the field the refusal names)."""
    if rec is None:
        raise Forbidden(f"job_id: Slurm has no record of job {job_id}")
    mine = rec.uid == uid if uid is not None and rec.uid is not None else rec.user == user
    if not mine:
        raise Forbidden(f"job_id: job {job_id} belongs to {rec.user}, not to the sender ({user})")
    outside = sorted(nodes - rec.nodes) if rec.nodes else sorted(nodes)
    if outside:
        raise Forbidden(f"{key}: job {job_id} did not run on {', '.join(outside[:5])} (Slurm's {rec.source})")
    return rec


class Verifier:
    """Proves the sender of each summary and report and checks its job against Slurm.

    ``slurm``: look a job up (``jobrecord.lookup``; None: no Slurm checks, a site whose
    collector cannot reach Slurm, so no user-sent summary is verified). ``cluster``: the
    Slurm cluster this collector checks (its ClusterName); a summary of another is refused.
    ``slurm_user``: SlurmUser's uid (root's counts always): its reports, and root's, are
    node evidence when made on the node they are about (``addresses``: a node's addresses
    as Slurm knows them). Lookups are cached for ``ttl`` seconds: one job's attempts
    arrive together.
    """

    def __init__(self, *, munge_socket: str | None = None,
                 slurm: Callable[[str], JobRecord | None] | None = jobrecord.lookup,
                 cluster: str | None = None, ttl: float = 10.0, slurm_user: int | None = None,
                 addresses: Callable[[str], frozenset[str] | None] | None = node_addresses) -> None:
        self.munge_socket, self.slurm, self.cluster, self.ttl = munge_socket, slurm, cluster, ttl
        self.slurm_user, self.addresses = slurm_user, addresses
        self._addr_cache: dict[str, tuple[float, frozenset[str] | None]] = {}
        self._cache: dict[str, tuple[float, JobRecord | None]] = {}
        self._lock = threading.Lock()
        self._asking = threading.BoundedSemaphore(ASK_SLURM_AT_ONCE)

    def verify(self, items: Sequence[Mapping[str, Any]], summaries: Sequence[JobSummary], sender: Sender) -> None:
        """Prove every summary of a request (``items``: as received) and attach the proof;
        ``Forbidden`` or ``Unavailable`` for the first that cannot be taken."""
        for item, s in zip(items, summaries):
            s.proven(self.prove(item, s, sender).stored())

    def prove(self, item: Mapping[str, Any], s: JobSummary, sender: Sender) -> Proof:
        """The proof for one summary (``item``: as received, ``s``: validated)."""
        auth = item.get(AUTH_KEY)
        cred = auth.get("munge") if isinstance(auth, dict) else None
        if cred is not None:
            dec = self._decode(cred, item)
            return self._job(Proof("munge", _name(dec.uid), dec.uid), s)
        if sender.user is not None:
            return self._job(Proof("token", sender.user, _uid(sender.user)), s)
        if sender.trusted:
            return Proof("trusted", s.user, _uid(s.user) if s.user else None)
        return Proof("none")

    def _ask(self, cache: dict[str, tuple[float, Any]], key: str, ask: Callable[[str], Any], what: str,
             ttl: float, fresh: bool = False) -> Any:
        """Slurm's answer about ``key`` (a job, a node), kept ``ttl`` seconds; at most
        ``ASK_SLURM_AT_ONCE`` asks in flight (the request pool is not Slurm's to fill)."""
        now = time.monotonic()
        with self._lock:
            hit = cache.get(key)
        if hit and now - hit[0] < ttl and not fresh:
            return hit[1]
        if not self._asking.acquire(timeout=ASK_WAIT_S):
            raise Unavailable("too many Slurm lookups at once; try again")
        try:
            answer = ask(key)
        except SlurmError as exc:
            raise Unavailable(f"Slurm cannot be asked about {what} {key} now: {exc}") from None
        finally:
            self._asking.release()
        with self._lock:
            if len(cache) > 10_000:
                cache.clear()
            cache[key] = (now, answer)
        return answer

    def _record(self, job_id: str, fresh: bool = False) -> JobRecord | None:
        assert self.slurm is not None
        return self._ask(self._cache, job_id, self.slurm, "job", self.ttl, fresh)

    def _job(self, proof: Proof, s: JobSummary) -> Proof:
        if self.slurm is None:
            return proof
        if not jobrecord.is_job_id(s.job_id):
            return Proof(proof.how, proof.user, proof.uid, "not-a-slurm-job")
        if s.cluster != (self.cluster or ""):    # one job, one key: no second copy under another cluster name
            raise Forbidden(f"cluster: {s.cluster!r} is not {self.cluster or ''!r}, the cluster this collector checks")
        try:
            rec = self._checked(proof, s, self._record(s.job_id))
        except Forbidden:           # a requeue since the cached answer: ask Slurm again before refusing
            rec = self._checked(proof, s, self._record(s.job_id, fresh=True))
        s.job_id = rec.job_id       # an array task's two names (123_4, 127): Slurm's own id
        return Proof(proof.how, rec.user or proof.user, proof.uid if proof.uid is not None else rec.uid, "slurm")

    def _checked(self, proof: Proof, s: JobSummary, rec: JobRecord | None) -> JobRecord:
        """``rec`` when it confirms what ``s`` says of its job, else ``Forbidden``."""
        rec = _theirs(rec, s.job_id, proof.uid, proof.user, set(s.nodes), "nodes")
        if s.requeues is not None and s.requeues > rec.restarts:
            raise Forbidden(f"requeues: job {s.job_id} was requeued {rec.restarts} times, not {s.requeues}")
        if s.attempt > rec.restarts + MAX_RESTARTS_IN_ALLOCATION:
            raise Forbidden(f"attempt: {s.attempt} is out of range for job {s.job_id} "
                            f"({rec.restarts} requeues)")
        first_start = rec.start if rec.source != "scontrol" or rec.restarts == 0 else None   # scontrol: this run's
        if first_start is not None and s.started < first_start - SLACK_S:
            raise Forbidden(f"started: before Slurm started job {s.job_id}")
        ended_by = min(rec.end or math.inf, time.time())       # a running job's EndTime is its time limit
        if s.ended is not None and s.ended > ended_by + SLACK_S:
            raise Forbidden(f"ended: after Slurm ended job {s.job_id}")
        # a summary without an end is dated by its start: that too lies within the job's run
        # (the vetting door's twin: a report's time must be while its job ran)
        if s.started > ended_by + SLACK_S:
            raise Forbidden(f"started: after Slurm ended job {s.job_id}")
        for v in s.vetting:
            if v.time > ended_by + SLACK_S or (first_start is not None and v.time < first_start - SLACK_S):
                raise Forbidden(f"vetting: node {v.node!r} vetted at {v.time:.0f}, when job {s.job_id} was not running")
        return rec

    # --- vetting reports ----------------------------------------------------------------

    def prove_report(self, item: Mapping[str, Any], reports: Sequence[Any], sender: Sender) -> ReportProof:
        """The evidence of one document of node reports (``item``: as received, its ``auth``
        over the rest; ``reports``: its validated ``NodeReport``s). ``Forbidden`` for a claim
        the cluster denies, ``Unavailable`` when munged or Slurm cannot be asked."""
        now = time.time()
        for r in reports:
            if r.time > now + SLACK_S:
                raise Forbidden(f"time: {r.time:.0f} is ahead of the collector's clock ({now:.0f})")
        auth = item.get(AUTH_KEY)
        cred = auth.get("munge") if isinstance(auth, dict) else None
        if cred is not None:
            dec = self._decode(cred, item, "report")
            name = _name(dec.uid)
            if dec.uid == 0 or (self.slurm_user is not None and dec.uid == self.slurm_user):
                self._on_its_node(name, dec.addr, reports)
                return ReportProof("node", name)
            return ReportProof("job", self._users_job(dec.uid, name, reports))
        if sender.trusted:
            return ReportProof("node", "trusted token")
        if sender.user is not None:
            return ReportProof("job", self._users_job(_uid(sender.user), sender.user, reports))
        return ReportProof("none")

    def _decode(self, cred: Any, item: Mapping[str, Any], what: str = "summary") -> munge.Decoded:
        try:
            dec = munge.decode(cred, self.munge_socket)
        except munge.MungeError as exc:
            if exc.transient:
                raise Unavailable(f"munged cannot decode credentials now: {exc}") from None
            if exc.replayed:
                raise Unproven(f"auth.munge: {exc}") from None
            raise Forbidden(f"auth.munge: {exc}") from None
        if dec.payload != digest(item):
            raise Forbidden(f"auth.munge: the credential vouches for another {what} (digest differs)")
        return dec

    def _addresses(self, node: str) -> frozenset[str] | None:
        assert self.addresses is not None
        return self._ask(self._addr_cache, node, self.addresses, "node", 60.0)

    def _on_its_node(self, name: str, addr: str, reports: Sequence[Any]) -> None:
        """Root's or SlurmUser's report is about the node it was made on, or refused."""
        if self.addresses is None or self.slurm is None:       # no Slurm: the site trusts MUNGE alone
            return
        for node in sorted({r.node for r in reports}):
            addrs = self._addresses(node)
            if addrs is None:
                raise Forbidden(f"node: Slurm has no node {node!r}")
            if addr not in addrs:
                raise Forbidden(f"node: {name}'s credential was made on {addr or 'an unknown address'}, "
                                f"not on {node} ({', '.join(sorted(addrs)) or 'no address'})")

    def _users_job(self, uid: int | None, user: str, reports: Sequence[Any]) -> str:
        """A user's report is of a job of theirs, on its nodes, while it ran; else refused.
        The sender as one person is counted by (``person``), whichever proof they used; each
        report's job id becomes Slurm's own (an array task's two names: one job)."""
        if self.slurm is None:
            return person(uid, user)
        jobs = {r.job_id for r in reports}
        if len(jobs) != 1 or not next(iter(jobs)):
            raise Forbidden("job_id: a user's report names the one Slurm job it vetted")
        job_id = str(next(iter(jobs)))
        if not jobrecord.is_job_id(job_id):
            raise Forbidden(f"job_id: {job_id[:40]!r} is not a Slurm job id")
        try:
            rec = self._ran(self._record(job_id), job_id, uid, user, reports)
        except Forbidden:           # a requeue since the cached answer: ask Slurm again before refusing
            rec = self._ran(self._record(job_id, fresh=True), job_id, uid, user, reports)
        for r in reports:
            r.job_id = rec.job_id
        return person(rec.uid if rec.uid is not None else uid, rec.user or user)

    def _ran(self, rec: JobRecord | None, job_id: str, uid: int | None, user: str,
             reports: Sequence[Any]) -> JobRecord:
        """``rec`` when the reports are of the sender's job, on its nodes, while it ran; else
        ``Forbidden``."""
        rec = _theirs(rec, job_id, uid, user, {r.node for r in reports}, "node")
        start = rec.start if rec.source != "scontrol" or rec.restarts == 0 else None
        ended_by = min(rec.end or math.inf, time.time())
        for r in reports:
            if (start is not None and r.time < start - SLACK_S) or r.time > ended_by + SLACK_S:
                raise Forbidden(f"time: job {job_id} was not running at {r.time:.0f}")
        return rec
