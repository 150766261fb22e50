"""Who sent a job summary, and whether the job is theirs: proven by the cluster, never
taken from the summary.

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


class Verifier:
    """Proves the sender of each summary and checks its job against Slurm.

    ``slurm``: look a job up (``jobrecord.lookup``; None: no Slurm checks, a site whose
    collector cannot reach Slurm, so no user-sent summary is verified). ``cluster``: the
    Slurm cluster this collector checks (its ClusterName); a summary of another is refused.
    Lookups are cached for ``ttl`` seconds: one job's attempts arrive together.
    """

    def __init__(self, *, munge_socket: str | None = None,
                 slurm: Callable[[str], JobRecord | None] | None = jobrecord.lookup,
                 cluster: str | None = None, ttl: float = 10.0) -> None:
        self.munge_socket, self.slurm, self.cluster, self.ttl = munge_socket, slurm, cluster, ttl
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
            try:
                dec = munge.decode(cred, self.munge_socket)
            except munge.MungeError as exc:
                if exc.transient:
                    raise Unavailable(f"munged cannot decode credentials now: {exc}") from None
                if exc.replayed:       # someone used it first: the sender makes a new one and tries again
                    raise Unproven(f"auth.munge: {exc}") from None
                raise Forbidden(f"auth.munge: {exc}") from None
            if dec.payload != digest(item):
                raise Forbidden("auth.munge: the credential vouches for another summary (digest differs)")
            return self._job(Proof("munge", _name(dec.uid), dec.uid), s)
        if sender.user is not None:
            return self._job(Proof("token", sender.user, _uid(sender.user)), s)
        if sender.trusted:
            return Proof("trusted", s.user, _uid(s.user) if s.user else None)
        return Proof("none")

    def _record(self, job_id: str, fresh: bool = False) -> JobRecord | None:
        assert self.slurm is not None
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(job_id)
        if hit and now - hit[0] < self.ttl and not fresh:
            return hit[1]
        if not self._asking.acquire(timeout=ASK_WAIT_S):   # the pool is not Slurm's to fill
            raise Unavailable("too many Slurm lookups at once; try again")
        try:
            rec = self.slurm(job_id)
        except SlurmError as exc:
            raise Unavailable(f"Slurm cannot be asked about job {job_id} now: {exc}") from None
        finally:
            self._asking.release()
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[job_id] = (now, rec)
        return rec

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
        if rec is None:
            raise Forbidden(f"job_id: Slurm has no record of job {s.job_id}")
        if proof.uid is not None and rec.uid is not None:
            mine = rec.uid == proof.uid
        else:
            mine = rec.user == proof.user
        if not mine:
            raise Forbidden(f"job_id: job {s.job_id} belongs to {rec.user}, not to the sender ({proof.user})")
        outside = sorted(set(s.nodes) - rec.nodes) if rec.nodes else sorted(s.nodes)
        if outside:
            raise Forbidden(f"nodes: job {s.job_id} did not run on {', '.join(outside[:5])} (Slurm's {rec.source})")
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
        return rec
