"""``hpcml run`` watching its job live: hangs and crashes named while the job runs.

The launcher reads the ranks' heartbeats (``hpcml.observe.beat``: one small record per rank
that its recorder rewrites once per interval) every ``period`` seconds: 1 s for a few
ranks, up to 5 s at 1,024: ~30 ms of reads per scan there, and the straggler model every
20 s, under 1 % of a core; at Alps's 10,752 ranks ~0.7 s a scan, 18 % of a core on a busy
2-core VM, 0.57 GB resident (benchmarks/bench_watch.py). The ranks do nothing for it beyond
what their recorder already did (and, for the Flight Recorder, one ``stat`` a second per
Python process: ``hpcml.run.inject``).

* **Crash**: a rank whose recorder wrote an exit code other than 0 is named at once, with
  the last line of its stderr that the rank wrote (``hpcml.run.ranklog``). Stopping the
  others is the launcher's (as srun's ``--kill-on-bad-exit``), within ``--kill-grace``.
  A rank that ends once the job is being stopped (a crash named, a hang or straggler stop,
  a lost node, a TERM or INT that ``hpcml run`` got and passed on: Ctrl-C, scancel, a
  requeue) was stopped, whatever its exit code: not a crash.
* **Hang**: no rank has completed a step (or a section) for ``--hang-timeout`` seconds:
  by default the larger of 10 x the median time between two progresses and 120 s (a job
  that logs every 100 steps waits 100 steps between them), never before the first
  step ends, so a job's start-up, a long evaluation or a checkpoint that fits under it is
  not a hang; a phase longer than that wants an explicit timeout (``off`` disables). Then
  every rank's recorder is asked for a snapshot (its Python stack through py-spy); once all
  have answered, or after ``COLLECT`` seconds less two scan periods (one for the detection,
  one for the last read: the verdict is out within ``COLLECT`` s of the timeout at 10,752
  ranks' 5 s scans as at 2 ranks' 1 s, however many recorders never answer), the answers
  that came are analysed (``hpcml.run.culprits``), one line
  per culprit goes to the job log, the verdict into run.json, and ``--on-hang stop`` stops
  the job, which then exits ``HANG``.

Only the ranks' own records count (``hpcml.observe.beat.Trust``): a record for a rank the
attempt did not start, or one its rank's recorder did not sign with the key the launcher
gave it (``secret``), is ignored and said once (run.json's ``ignored_beats``); so is an
older record put back over a newer one. A rank whose record stops changing (its file
replaced or removed) is idle for the hang from then on, by the launcher's clock: a program
that writes in the job directory can neither fake progress nor a crash, nor hide a hang.
What this protects against is an accident or a confused script; a program that sets out to
forge a record must first take its wrapper's key (see ``hpcml.run.task``).

Every event goes into run.json's ``timeline`` (when it began as far as the data shows, when
it was detected, what was named, what was done) for the report.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpcml import logs
from hpcml.cluster import requeue
from hpcml.jobmodel import Attempt, Event, FaultKind, Hang, HangVerdict, IgnoredBeat, StoppedFor, Straggler
from hpcml.observe.beat import Beat, Trust, read_beats
from hpcml.observe.loadercores import Short
from hpcml.observe.loadercores import short as is_short
from hpcml.observe.snapshot import FLIGHT_RECORDER, read_stacks, request
from hpcml.observe.stacks import Stack
from hpcml.observe.straggler_limits import CONTENDED, MIN_SECONDS
from hpcml.run.config import HANG as HANG  # re-exported: the exit code is the watch's
from hpcml.run.config import ON_HANG as ON_HANG
from hpcml.run.cpuwaits import CpuWaits
from hpcml.run.culprits import name
from hpcml.run.ending import signal_name
from hpcml.run.jobdir import attempt_dir, log_path, observe_dir
from hpcml.run.ranklog import failure_line
from hpcml.run.steptimes import StepTimes
from hpcml.words import node_name, printable, ranges

if TYPE_CHECKING:
    from hpcml.observe.hang import HangReport
    from hpcml.run.watchexport import WatchExporter

log = logs.get(__name__)

AUTO_FLOOR = 120.0            # the default hang timeout is never below this (s)
AUTO_STEPS = 10.0             # ... and at least this many median step times
COLLECT = 30.0                # the verdict is out within this many seconds of the hang timeout: ...
COLLECT_LEAST = 10.0          # ... the snapshots waited for this less two scan periods, at least this
FR_GRACE = 2.0                # after the last stack, for the Flight Recorder dumps (written within ~1 s)
STRAGGLER_EVERY = 20.0        # seconds between straggler scorings at most (the model's cost, at 1,024 ranks) ...
STRAGGLER_SCORINGS = 3        # ... and at least this many per window
ARRIVALS_EVERY = 10.0         # seconds between two looks at the ranks' periodic Flight Recorder dumps
EARLY_STEPS = 10              # a slowness that began inside the window is named after this many steps ...
EARLY_SHARE = 0.8             # ... this share of them slow, and a third of the window
STOPPING = (signal.SIGTERM, signal.SIGINT)    # passed on to the ranks: the ranks that end then were stopped
IGNORED_SAID = 16             # records refused that are said (and kept in run.json) one by one; then one line
SIGNALLED = tuple(128 + s for s in STOPPING)   # a rank's exit code when one of them ended it
SAID_MAX = 4000               # characters of one line the watch says (a hang's verdict names many ranks)
LOADER_RECORDS = 2            # a rank's records that show its workers short of cores before it is said


def period_for(world: int) -> float:
    """Seconds between scans: 1 s up to 200 ranks, 5 s from 1,000."""
    return min(5.0, max(1.0, world / 200))




def contention(st: Straggler) -> str:
    """"its threads waited for a CPU 0.45 s per second; CPU steal 0%; its GPU's clocks were held
    back 64% of the time (hw_thermal_slowdown)": each measure that held the rank back."""
    reasons = f" ({', '.join(st.gpu_throttle)})" if st.gpu_throttle else ""
    parts = [f"its threads waited for a CPU {st.cpu_wait:.2f} s per second" if st.cpu_wait is not None else "",
             f"{st.steal * 100:.0f}% of its node's CPU time was stolen by the hypervisor" if st.steal else "",
             f"its GPU's clocks were held back {st.gpu_throttled * 100:.0f}% of the time{reasons}"
             if st.gpu_throttled else "",
             f"its CPU cores ran throttled for heat {st.cpu_throttled * 100:.0f}% of the time"
             if st.cpu_throttled else ""]
    return "; ".join(p for p in parts if p)


def held_back_by(st: Straggler) -> str:
    """What a contended rank's slowness came from, for the end of its line."""
    if (st.gpu_throttled or 0.0) >= CONTENDED and (st.steal or 0.0) < CONTENDED:
        return "its GPU's power or cooling held it back, not the rank slow"
    if (st.cpu_throttled or 0.0) >= CONTENDED and (st.steal or 0.0) < CONTENDED:
        return "its node's CPU cooling held it back, not the rank slow"
    return "its node's CPUs were oversubscribed, not the rank slow"


def slower(st: Straggler) -> str:
    """"1.8x slower since step 31", or, named by the Flight Recorder's arrivals (no step
    ratio measured it), "the last to start most collectives"."""
    if st.measure == "arrivals":
        return "the last to start most collectives (Flight Recorder arrivals)"
    return f"{st.score:.1f}x slower {straggler_since(st)}"


def straggler_since(st: Straggler) -> str:
    """"since step 31", or "since step 120 or earlier" when the judged window began slow."""
    return f"since step {st.since_step:,}" + (" or earlier" if st.since_before else "")


def gpu_named(st: Straggler) -> str:
    """" (GPU-8f2c...)": the rank's GPUs as the GPU names itself, one name on every node and
    in every numbering (Slurm's, CUDA's, NVML's); nothing where none is proven the rank's."""
    return f" ({', '.join(st.gpu_uuids)})" if st.gpu_uuids else ""


@dataclass(frozen=True, slots=True)
class Seen:
    """What the watch saw, as the attempt's record fields (``RunRecord``): the models
    themselves. ``stopped_for`` and ``ignored_beats`` are fields of the record only when
    there is one (``into``, ``to_json``)."""

    timeline: list[Event]
    hang: Hang | None
    stragglers: list[Straggler]
    furthest_step: int | None
    first_step_at: float | None
    stopped_for: StoppedFor | None = None
    ignored_beats: list[IgnoredBeat] = field(default_factory=list)
    contended: list[Straggler] = field(default_factory=list)

    def into(self, record: Attempt) -> None:
        """Set them on the attempt's record."""
        record.timeline, record.hang, record.stragglers = self.timeline, self.hang, self.stragglers
        record.furthest_step, record.first_step_at = self.furthest_step, self.first_step_at
        if self.stopped_for:
            record.stopped_for = self.stopped_for
        if self.ignored_beats:
            record.ignored_beats = self.ignored_beats
        if self.contended:
            record.contended = self.contended

    def to_json(self) -> dict[str, object]:
        """As run.json has them."""
        return {"timeline": [e.to_json() for e in self.timeline], "hang": self.hang.to_json() if self.hang else None,
                "stragglers": [s.to_json() for s in self.stragglers], "furthest_step": self.furthest_step,
                "first_step_at": self.first_step_at,
                **({"stopped_for": self.stopped_for.to_json()} if self.stopped_for else {}),
                **({"ignored_beats": [i.to_json() for i in self.ignored_beats]} if self.ignored_beats else {}),
                **({"contended": [c.to_json() for c in self.contended]} if self.contended else {})}


@dataclass
class Watch:
    d: Path
    attempt: int
    world: int
    timeout: float | None = None          # None: auto; inf: off (``--hang-timeout off``)
    on_hang: str = "stop"
    period: float | None = None
    timeline: list[Event] = field(default_factory=list)
    hang: Hang | None = None
    hang_judged: bool = False                    # the hang check ran past the first step, with a timeout
    beats: dict[int, Beat] = field(default_factory=dict)
    _next: float = 0.0
    _crashed: set[int] = field(default_factory=set)
    _stopping: bool = False
    stragglers: dict[int, Straggler] = field(default_factory=dict)
    contended: dict[int, Straggler] = field(default_factory=dict)   # slow ranks that waited for their node's CPUs
    _next_scoring: float = 0.0
    exporter: WatchExporter | None = None        # --prometheus-port
    scores: dict[int, float] = field(default_factory=dict)
    crashed_codes: dict[int, int] = field(default_factory=dict)
    _collect: tuple[int, float] | None = None    # (snapshot id, give up at)
    _fr_until: float | None = None
    on_straggler: str = "report"                 # restart: a straggler stops the job (hpcml.run.recovery)
    can_replace: Callable[[str | None], bool] | None = None   # node -> whether a restart without it is possible now
    stopped_for: StoppedFor | None = None        # the straggler the job was stopped for
    secret: bytes | None = None                  # the attempt's: each rank's records are signed with its key
    interval: float = 1.0                        # seconds between two records of a rank (--interval)
    signals: list[int] = field(default_factory=list)    # what hpcml run got and passed on, in order
    job_id: str | None = None                    # with restart_of: this attempt's requeue marker (cluster.requeue)
    restart_of: int = 0
    ignored: list[IgnoredBeat] = field(default_factory=list)       # records not taken, each said once
    straggler_window: float = MIN_SECONDS        # seconds of steps the straggler model judges (--straggler-window)

    def __post_init__(self) -> None:
        self.observe = observe_dir(self.d, self.attempt)
        self.period = self.period or period_for(self.world)
        self._steps = StepTimes(self.world)
        self._cpu = CpuWaits(self.world)
        self._waits_seen = False                             # some rank measured its waits in collectives
        self._said_untimed = False                           # said once: NCCL's dumps carry no timing
        self._fr_read: dict[str, tuple[Any, Any]] = {}       # periodic dump -> ((mtime, size), its reduce or None)
        self._next_arrivals = 0.0
        self._trust = Trust(self.world, self.secret)
        self._changed: dict[int, tuple[float | None, float]] = {}   # rank -> (its record's beat, when we saw it change)
        self._held: dict[int, float] = {}                    # rank -> when its exit by TERM or INT was seen
        self._said: set[tuple[int, str]] = set()             # the refusals said
        # rank -> (its records that showed its workers short of cores, the last one's beat); None once said
        self._loader_short: dict[int, tuple[int, float | None]] | None = {}

    # -- the launcher calls these ----------------------------------------------------------

    def poll(self, now: float | None = None) -> str | None:
        """Scan when due; "stop" when the job must be stopped now (a hang, ``--on-hang stop``)."""
        now = time.time() if now is None else now
        if now < self._next:
            return None
        self._next = now + (self.period or 1.0)
        self._read(now)
        for rank, b in self.beats.items():
            self._steps.add(rank, b.recent_steps, b.recent_s, b.restarts, b.recent_wait)
            self._waits_seen = self._waits_seen or bool(b.recent_wait)
            if b.cpu_wait_s is not None or b.gpu_throttled_s is not None or b.cpu_throttled_s is not None:
                self._cpu.add(rank, b.beat, b.cpu_wait_s, b.steal_s, b.gpu_throttled_s, b.cpu_throttled_s)
            if b.workers is not None and self._loader_short is not None:
                self._loader_cores(rank, b)
        self._crashes(now)
        self._stragglers(now)
        self._arrivals(now)
        action = "stop" if self._straggler_stop() else None
        if self._collect is not None:
            action = self._conclude(now)
        elif self.hang is None:
            self._hang(now)
        if self._collect is not None:                # conclude on time, not a scan period late
            self._next = min(self._next, self._collect[1], self._fr_until or self._next)
        if self.exporter is not None:
            self.exporter.update(self.beats, self.scores, self.stragglers, self.crashed_codes,
                                 True if self.hang is not None else False if self.hang_judged else None)
        return action

    def stopping(self, kind: FaultKind, what: str, began: float | None, node: str) -> None:
        """The launcher stops the job for a reason of its own (a node lost, ``node``): into the
        timeline; the ranks that end from now on were stopped, not crashed."""
        self._stopping = True
        self.timeline.append(Event(kind=kind, began=began, detected=time.time(), what=what, action="stop", node=node))

    def finish(self) -> None:
        """The job ended: name the crashes the last scan did not see."""
        self._read(time.time())
        self._crashes(time.time(), final=True)
        if self._collect is not None:                  # the job ended while the stacks came: name from what came
            self._conclude(time.time(), ended=True)

    def fields(self) -> Seen:
        """What the watch saw, as the attempt's record fields (``RunRecord``)."""
        steps = [b.step for b in self.beats.values() if b.step is not None]
        firsts = [b.first for b in self.beats.values() if b.first is not None]
        return Seen(timeline=self.timeline, hang=self.hang, stragglers=list(self.stragglers.values()),
                    furthest_step=max(steps, default=None), first_step_at=min(firsts, default=None),
                    stopped_for=self.stopped_for, ignored_beats=self.ignored, contended=list(self.contended.values()))

    def to_json(self) -> dict[str, object]:
        """``fields`` as run.json has them."""
        return self.fields().to_json()

    def _straggler_stop(self) -> bool:
        """``--on-straggler restart``: the first straggler named stops the job (once)."""
        if self.on_straggler != "restart" or self.stopped_for or not self.stragglers or self._stopping:
            return False
        first = min(self.stragglers.values(), key=lambda s: s.detected)
        if self.can_replace is not None and not self.can_replace(first.node):
            return False                         # no spare, --min-nodes, no restart left: it runs on, slower
        self.stopped_for = StoppedFor(what=f"rank {first.rank} {slower(first)}",
                                      node=first.node, rank=first.rank, began=None, detected=first.detected)
        self._stopping = True
        self._say(f"straggler: stopping the job to restart without {node_name(first.node)} (--on-straggler restart)")
        return True

    # -- what it looks for -----------------------------------------------------------------

    def _read(self, now: float) -> None:
        """The ranks' records that ``Trust`` takes; a record refused is said once, and when
        each rank's record last changed is noted (``_idle``)."""
        self.beats = read_beats(self.observe, self.beats, self._trust)
        for (rank, why), file in self._trust.refused.items():
            if (rank, why) in self._said or len(self._said) > IGNORED_SAID:
                continue
            self._said.add((rank, why))
            if len(self._said) > IGNORED_SAID:
                self._say("ignoring more heartbeats that are not this attempt's ranks' (not said one by one)")
                continue
            self.ignored.append(IgnoredBeat(rank=rank, why=why, file=str(file), seen=now))
            started = f"ranks 0-{self.world - 1}" if self.world > 1 else "rank 0"
            self._say(f"ignoring heartbeats for rank {rank} in {file}: {why} (this attempt started {started})")
        for rank, b in self.beats.items():
            if self._changed.get(rank, (None,))[0] != b.beat:
                self._changed[rank] = (b.beat, now)

    def _loader_cores(self, rank: int, b: Beat) -> None:
        """Said once, while the job runs: a rank whose DataLoader workers wait for a CPU
        (``hpcml.observe.loadercores``, the report's rule), seen in two of its records, so
        that the user can fix the job script before the job's hours are spent."""
        shorts = self._loader_short
        if shorts is None or b.workers is None or not is_short(b.workers, b.cores, b.workers_cpu_percent):
            return
        seen, last = shorts.get(rank, (0, None))
        if b.beat == last:
            return
        shorts[rank] = (seen + 1, b.beat)
        if seen + 1 < LOADER_RECORDS:
            return
        self._loader_short = None
        worst = Short(rank, node_name(b.node) if b.node else "its node", b.workers, float(b.cores or 0),
                      b.workers_cpu_percent or 0.0)
        self._say(f"{worst.what(len(shorts) - 1)}; {worst.fix()}")

    def _idle(self, rank: int, b: Beat, now: float) -> float:
        """Seconds since the rank's last progress, on its own clock; or, when its record
        stopped changing (its file replaced, its recorder gone), since then on ours, less
        the time a record may take to come."""
        own = (b.beat if b.beat is not None else now) - (b.progress or 0.0)
        unchanged = now - self._changed.get(rank, (None, now))[1] - (self.interval + 2 * (self.period or 1.0))
        return max(own, unchanged)

    def _signalled(self) -> bool:
        return any(s in STOPPING for s in self.signals)

    def _hold(self, ended: list[tuple[int, int]], now: float) -> bool:
        """Whether to wait before naming crashes: a rank ended by TERM or INT (143, 130) may
        have got it from Slurm in the same moment as hpcml run (scancel, the time limit, a
        requeue: each node's slurmd signals its own steps), and that rank, seen before the
        launcher's own signal, would be named a crash. One scan's wait (at most ``period``
        seconds, only for such exits) lets the launcher's signal come first."""
        held = [r for r, code in ended if code in SIGNALLED]
        for r in held:
            self._held.setdefault(r, now)
        return any(now - self._held[r] < (self.period or 1.0) for r in held)

    def _requeued(self, code: int) -> bool:
        """A rank that Slurm's requeue ended, once ``hpcml ckpt`` noted that it asked for one
        (it writes the marker before ``scontrol requeue``)."""
        if code not in requeue.KILLED_BY_REQUEUE:
            return False
        return requeue.find(attempt_dir(self.d, self.attempt), self.job_id, self.restart_of, ask_slurm=False) \
            is not None

    def _say(self, line: str) -> None:
        """One line of the watch's: its words hold the job's own (a log's line, a stack's or a
        Flight Recorder dump's names), shown as text, never a terminal escape or a faked line."""
        log.info(f"hpcml run: {printable(line, SAID_MAX)}")

    def _crashes(self, now: float, final: bool = False) -> None:
        """Ranks that exited non-zero, in the order they ended. Once the job is being stopped
        (a crash named, a hang stopped, TERM or INT passed on, Slurm's requeue asked for by
        ``hpcml ckpt``), the ranks that end were stopped, not crashed, whatever code their TERM
        handler chose. ``final``: the attempt ended, nothing more will come (``_hold``)."""
        ended = sorted(((b.beat or 0.0, r, b.exit, b) for r, b in self.beats.items()
                        if b.exit and r not in self._crashed),
                       key=lambda e: (e[0], e[1]))
        if not final and self._hold([(r, code) for _, r, code, _ in ended], now):
            return
        for _, rank, code, b in ended:
            self._crashed.add(rank)
            if self._stopping or (self.hang is not None and self.hang.action == "stop") or self._signalled() \
                    or self._requeued(code):
                continue                  # stopped by us: TERM's 143, or what its handler chose to exit with
            self._stopping = True
            self.crashed_codes[rank] = code
            last = failure_line(log_path(self.d, rank, "err"), self.attempt, None if b.signal else code)
            step = f" after step {b.step}" if b.step is not None else ""
            how = f"exited {code}" + (f" (killed by {signal_name(b.signal)})" if b.signal else "")
            self._say(f"crash: rank {rank} on {node_name(b.node)} {how}{step}" + (f": {last}" if last else ""))
            self.timeline.append(Event(kind="crash", what=f"rank {rank} {how}", began=b.beat, detected=now,
                                       rank=rank, node=b.node, exit_code=code, stderr=last, step=b.step))

    def _stragglers(self, now: float) -> None:
        """The end-of-job report's model (``observe.stragglers.score_matrix`` on the ranks'
        compute times, its chronic threshold) over the last ``straggler_window`` seconds of
        steps every rank reported, or the whole ring once it is full and holds less (2,048
        steps: a job of 10 ms steps is judged on its last 20 s): a rank that turns
        chronic is named once. Scored every third of the window (at most every
        ``STRAGGLER_EVERY`` s).

        A rank whose slowness began inside the window is named before it fills the window
        once the evidence is there (``_turned_slow``). Each is named with the step its
        slowness began: the change point of its ratios over the ring (``stragglers.onset``),
        which sees further back than a window that is slow from its first step."""
        if now < self._next_scoring:
            return
        self._next_scoring = now + min(STRAGGLER_EVERY, max(1.0, self.straggler_window / STRAGGLER_SCORINGS))

        from hpcml.observe.stragglers import CHRONIC, MIN_STEPS, score_matrix
        median = self._steps.median_step()
        if not median or median <= 0:
            return
        wanted = max(MIN_STEPS, int(1.1 * self.straggler_window / median) + 1)
        keep = min(self._steps.size, wanted)
        ranks, window, m = self._steps.window(keep, busy=True)
        if len(window) < MIN_STEPS:
            return
        elapsed = self._steps.window(keep)[2]
        # the window holds more steps than the ring: the ring's are the evidence (fast steps,
        # and some missing where a record holds fewer than came between two reads)
        ring = wanted > keep and int(window[-1] - window[0]) + 1 >= 0.9 * keep
        scores = score_matrix(ranks, window, m, elapsed=elapsed,
                              meta_ranks={str(r): {"node": b.node if (b := self.beats.get(int(r))) else None} for r in ranks},
                              min_seconds=0.0 if ring else self.straggler_window)
        self.scores = {sc.rank: round(sc.score, 4) for sc in scores}
        if not scores or not scores[0].judged:
            return
        named = self.stragglers.keys() | self.contended.keys()
        new = {sc.rank: (sc.score, sc.confidence) for sc in scores if sc.chronic and sc.rank not in named}
        # a rank that turned slow shows in the window's last steps (its trend) before it is chronic;
        # the ring's change points (a ranks x 2,048 pass) only when some rank does
        if not new and not any(sc.trend > 1 + CHRONIC and sc.rank not in named for sc in scores):
            return
        ranks, steps, ratio, onsets, took = self._onsets()       # took: seconds from each step on
        row = {int(r): i for i, r in enumerate(ranks)}
        new.update((r, got) for r, got in self._turned_slow(ranks, ratio, onsets, took).items()
                   if r not in named and r not in new)
        node = {sc.rank: sc.node for sc in scores}
        named_now: list[Straggler] = []
        for rank, (score, confidence) in sorted(new.items()):
            i = row.get(rank)
            at = int(onsets[i]) if i is not None and onsets[i] >= 0 else None
            first = int(steps[0]) if len(steps) else int(window[0])
            # slow from the stretch's first step: since then, or earlier (unless that is the job's first step)
            slow_s = float(took[at]) if at is not None else self.straggler_window
            st = Straggler(rank=rank, node=node.get(rank), score=round(score, 3),
                           since_step=int(steps[at]) if at is not None else first,
                           since_before=at is None and first > self._steps.first_step(),
                           confidence=confidence, detected=now, gpu_uuids=self._gpus_of(rank))
            judged_s = min(slow_s, self.straggler_window)
            if self._unmeasured(rank, judged_s):
                continue                  # its CPU wait not measured over that time yet: judged next scan
            if self._held_back(st, judged_s):
                self._contended(st, now)
                continue
            st.measure = "compute" if self._waits_seen else "step"
            self.stragglers[rank] = st
            named_now.append(st)
        said: set[str] = set()
        for st in named_now:
            whole = self._whole_node(st.node)
            if whole and st.node in said:
                continue                                    # said once for the node, with its first rank now
            if whole:
                said.add(str(st.node))
            who = f"node {st.node}: all {len(self._node_ranks(st.node))} of its ranks" if whole else f"rank {st.rank}"
            what = f"{who} {st.score:.1f}x slower {straggler_since(st)}"
            self._say(f"straggler: {who}{'' if whole else f' on {st.node}{gpu_named(st)}'} {st.score:.1f}x slower "
                      f"{straggler_since(st)} (confidence {st.confidence or 0.0:.2f}){self._gpu_unknown(st)}")
            self.timeline.append(Event(kind="straggler", what=what, began=None, detected=now, rank=st.rank,
                                       node=st.node, score=st.score, since_step=st.since_step))

    def _gpus_of(self, rank: int) -> list[str] | None:
        """The rank's GPUs by UUID, as its recorder proved them (its heartbeat's ``gpu_uuids``)."""
        b = self.beats.get(rank)
        return list(b.gpu_uuids) if b is not None and b.gpu_uuids else None

    def _node_ranks(self, node: str | None) -> list[int]:
        return sorted(r for r, b in self.beats.items() if node is not None and b.node == node)

    def _whole_node(self, node: str | None) -> bool:
        """Whether every rank ``node`` holds (two or more) is a straggler now: the node is
        slow, not a rank, and the ranks named in one scoring are said once, as the node."""
        ranks = self._node_ranks(node)
        return len(ranks) >= 2 and all(r in self.stragglers for r in ranks)

    def _arrivals(self, now: float) -> None:
        """Where no rank measures its waits in collectives (NCCL: a CPU-side timer sees none),
        who starts each collective last, from the ranks' latest periodic Flight Recorder
        dumps (``hpcml.observe.arrivals``), read when one changed: a rank the arrivals name is
        a straggler by that measure."""
        if self._waits_seen or now < self._next_arrivals:
            return
        self._next_arrivals = now + ARRIVALS_EVERY
        from hpcml.observe.arrivals import LIVE, LIVE_DUMP_MAX, UNTIMED, arrivals, reduce, straggler, untimed_nccl
        from hpcml.observe.hang import load_dump
        live = self.observe / LIVE
        files: dict[str, tuple[float, int]] = {}
        for rank in range(self.world):                   # the ranks' own names only: nothing else is read
            try:
                seen = (live / f"rank-{rank:05d}").stat()
            except OSError:
                continue
            files[str(live / f"rank-{rank:05d}")] = (seen.st_mtime, seen.st_size)
        changed = [f for f, seen in files.items() if self._fr_read.get(f, (None, None))[0] != seen]
        if not changed:
            return
        for f in changed:                                # only the dumps that changed, kept reduced
            try:
                self._fr_read[f] = (files[f], reduce(load_dump(f, LIVE_DUMP_MAX)))
            except Exception as exc:  # noqa: BLE001 - a file the job's own program wrote: not read, never fatal
                self._fr_read[f] = (files[f], None)
                log.debug("hpcml run: %s not read: %s", f, exc)
        dumps = {int(Path(f).name.removeprefix("rank-")): d for f, (_, d) in self._fr_read.items()
                 if d is not None and f in files}
        step_s = self._steps.median_step()
        try:                  # the window the step model judges (it adapts to the step time), as collectives
            scores = arrivals(dumps, since=now - self.straggler_window)
            top = straggler(scores, self.world, step_s)
        except Exception as exc:  # noqa: BLE001 - hostile dumps must not stop the watch
            log.debug("hpcml run: the arrivals were not judged: %s", exc)
            return
        if not scores and not self._said_untimed and untimed_nccl(dumps):
            self._said_untimed = True             # once: silence would read as "no straggler"
            self._say(f"not judged: {UNTIMED}")
        if top is None or top.rank in self.stragglers or top.rank in self.contended:
            return
        b = self.beats.get(top.rank)
        step = b.step if b is not None and b.step is not None else 0
        began = top.since_t is not None and bool(step_s)
        if top.since_t is not None and step_s:   # its onset in time, to a step: the steps since at the job's pace
            last = b.progress if b is not None and b.progress is not None else now
            onset_t = min(max(top.since_t, now - self.straggler_window), last)
            step = max(0, step - round((last - onset_t) / step_s))
        st = Straggler(rank=top.rank, node=b.node if b else None, score=self.scores.get(top.rank, 1.0),
                       since_step=step, since_before=not began,
                       confidence=round(top.last_share * top.stability, 3), detected=now, measure="arrivals",
                       gpu_uuids=self._gpus_of(top.rank))
        if self._held_back(st, self.straggler_window):
            self._contended(st, now)
            return
        self.stragglers[top.rank] = st
        what = (f"rank {top.rank} arrived last at {top.last_share * 100:.0f}% of {top.collectives} collectives, "
                f"{top.late_s * 1000:.1f} ms after the others, {straggler_since(st)} (Flight Recorder, {top.measure})")
        self._say(f"straggler: {what.replace(f'rank {top.rank}', f'rank {top.rank} on {st.node}{gpu_named(st)}', 1)} "
                  f"(confidence {st.confidence or 0.0:.2f}){self._gpu_unknown(st)}")
        self.timeline.append(Event(kind="straggler", what=what, began=None, detected=now, rank=top.rank,
                                   node=st.node, since_step=st.since_step))

    def _unmeasured(self, rank: int, seconds: float) -> bool:
        """Whether the rank reports its CPU wait but the ring does not cover ``seconds`` of it
        yet (a job's first seconds): naming it a straggler then could be a contended rank's."""
        b = self.beats.get(rank)
        return b is not None and b.cpu_wait_s is not None and self._cpu.shares(rank, seconds)[0] is None

    def _held_back(self, st: Straggler, seconds: float) -> bool:
        """Fills in what held the rank back over its last ``seconds`` (its threads' wait for a
        CPU, its node's CPU steal, its GPUs' throttled clocks beyond the other ranks' typical
        share, and why); whether its wait or its throttling beyond the other ranks' median, or
        its steal, reached ``CONTENDED``: then it is contention, not a straggler. (What every
        rank has alike, more threads than cores, sets no rank apart; against other ranks nobody
        measured, it is unknown.)"""
        import numpy as np

        from hpcml.samplers.clockreasons import reason_names
        st.cpu_wait, st.steal, st.gpu_throttled, st.cpu_throttled = self._cpu.shares(st.rank, seconds)
        beyond = [0.0, 0.0, 0.0]            # its CPU wait, GPU and CPU throttling beyond the others' median
        known = [True, True, True]          # whether any other rank's figure was measured
        if st.cpu_wait or st.gpu_throttled or st.cpu_throttled:
            others = [self._cpu.shares(r, seconds) for r in self.beats if r != st.rank]
            for k, (mine, i) in enumerate(((st.cpu_wait, 0), (st.gpu_throttled, 2), (st.cpu_throttled, 3))):
                theirs = [x for o in others if (x := o[i]) is not None]
                if not theirs:              # what every rank may have alike excuses no rank: unknown, not 0
                    known[k] = False
                    continue
                beyond[k] = max(0.0, (mine or 0.0) - float(np.median(theirs)))
        if st.gpu_throttled is not None:
            st.gpu_throttled = round(beyond[1], 3) if known[1] else None
        if st.cpu_throttled is not None:
            st.cpu_throttled = round(beyond[2], 3) if known[2] else None
        b = self.beats.get(st.rank)
        if st.gpu_throttled and b is not None and b.gpu_throttle:
            st.gpu_throttle = reason_names(b.gpu_throttle)
        return any(x >= CONTENDED for x in (beyond[0], st.steal or 0.0, beyond[1], beyond[2]))

    def _gpu_unknown(self, st: Straggler) -> str:
        """What a straggler's line says where the job's GPUs' clocks are measured but whether
        this rank's held it back is not known (no GPU proven its, or its GPU lost, or no other
        rank's measured): unknown, not "not held back"."""
        if st.gpu_throttled is not None or not any(b.gpu_throttled_s is not None for b in self.beats.values()):
            return ""
        return "; whether its GPU's clocks held it back is unknown"

    def _contended(self, st: Straggler, now: float) -> None:
        """A slow rank whose threads waited for a CPU (or whose node's CPUs were stolen, or
        whose GPU's clocks were held back) as long as ``CONTENDED`` of the time: the node's
        CPUs are oversubscribed, by something outside the job or by more threads than cores,
        or the GPU's power or cooling slows it; named as that, not as a straggler
        (``--on-straggler restart`` does not act on it)."""
        self.contended[st.rank] = st
        what = f"rank {st.rank} {slower(st)} while {contention(st)}: {held_back_by(st)}"
        self._say(f"contention: {what.replace(f'rank {st.rank}', f'rank {st.rank} on {st.node}{gpu_named(st)}', 1)}")
        self.timeline.append(Event(kind="contention", what=what, began=None, detected=now, rank=st.rank,
                                   node=st.node, score=st.score, since_step=st.since_step))

    def _onsets(self) -> tuple[Any, Any, Any, Any, Any]:
        """(ranks, steps, ratio to the others, each rank's onset index or -1, the seconds of
        steps from each step on, on the median rank) over the whole ring of steps every rank
        reported."""
        import numpy as np

        from hpcml.observe.stragglers import CHRONIC, onsets, others_median
        ranks, steps, m = self._steps.window(self._steps.size, busy=True)
        ratio = m / others_median(m)
        took = self._steps.window(self._steps.size)[2]
        since = np.median(np.cumsum(took[:, ::-1], axis=1)[:, ::-1], axis=0) if took.size else np.zeros(0)
        return ranks, steps, ratio, onsets(ratio, 1 + CHRONIC), since

    def _turned_slow(self, ranks: Any, ratio: Any, at: Any, took: Any) -> dict[int, tuple[float, float]]:
        """Ranks whose slowness began inside the window and has lasted ``EARLY_STEPS`` steps
        and a third of the window since, slow in ``EARLY_SHARE`` of those steps: rank ->
        (its median ratio since, the share of its slow steps since, scaled down below
        ``MIN_STEPS`` steps as the model's confidence is)."""
        import numpy as np

        from hpcml.observe.stragglers import CHRONIC, MIN_STEPS
        out: dict[int, tuple[float, float]] = {}
        for i in np.flatnonzero(at >= 0):
            since = ratio[i, int(at[i]):]
            seconds = float(took[int(at[i])])
            if len(since) < EARLY_STEPS or seconds < self.straggler_window / 3:
                continue
            share = float(np.mean(since > 1 + CHRONIC))
            if share >= EARLY_SHARE:
                out[int(ranks[i])] = (float(np.median(since)), round(share * min(1.0, len(since) / MIN_STEPS), 3))
        return out

    def hang_timeout(self) -> float:
        if self.timeout is not None:
            return self.timeout
        # the time between two progresses each rank saw (a job that logs every 100 steps
        # waits 100 steps between them), else the step time; ranks that log nothing don't count
        gaps = sorted(b.gap_s for b in self.beats.values() if b.gap_s)
        median = gaps[len(gaps) // 2] if gaps else self._steps.median_step()
        return max(AUTO_FLOOR, AUTO_STEPS * median) if median and median > 0 else AUTO_FLOOR

    def _hang(self, now: float) -> None:
        """Each rank's idle time is its record's ``beat`` minus its ``progress``, both taken by
        its own node's clock, so a node whose clock is off does not make a hang (or hide one);
        a record that stopped changing does not hide one either (``_idle``)."""
        alive = {r: b for r, b in self.beats.items() if b.exit is None}
        idle = [self._idle(r, b, now) for r, b in alive.items() if b.progress is not None]
        if not alive or not idle:
            return                               # never before the first step ends
        quiet, limit = min(idle), self.hang_timeout()
        self.hang_judged = self.hang_judged or limit != float("inf")      # --hang-timeout off: never
        if quiet < limit:
            return
        steps = [b.step for b in alive.values() if b.step is not None]
        self._say(f"hang: no rank completed a step for {quiet:.0f} s (timeout {limit:.0f} s; furthest step "
                  f"{max(steps) if steps else 'none'}); taking every rank's stack")
        self.hang = Hang(began=now - quiet, detected=now, timeout=limit, ranks=len(alive))
        ident = int(now * 1000)
        for old in (self.observe / FLIGHT_RECORDER).glob("rank-*"):    # what is there after this is fresh
            try:
                old.unlink()
            except OSError:
                pass                                  # not a file (the user's): analysis refuses it
        request(self.observe, ident)
        # one period for the detection's lateness, one for the concluding read's own time (over
        # a second at 10,752 ranks on a busy host): out within COLLECT s of the timeout
        self._collect = (ident, now + max(COLLECT_LEAST, COLLECT - 2 * (self.period or 1.0)))

    def _conclude(self, now: float, ended: bool = False) -> str | None:
        """``ended``: the job ended by itself before the verdict; nothing is stopped."""
        assert self._collect is not None and self.hang is not None
        ident, give_up = self._collect
        alive = [r for r, b in self.beats.items() if b.exit is None or ended]
        if not ended:
            answered = [r for r in alive if (self.beats[r].snapshot or 0) >= ident]
            if len(answered) < len(alive) and now < give_up:
                return None
            if self._fr_until is None:
                self._fr_until = now + FR_GRACE
            if now < self._fr_until and now < give_up:
                return None
        self._collect, self._fr_until = None, None
        stacks = {r: s.stack for r, s in read_stacks(self.observe, trust=self._trust).items() if s.snapshot == ident}
        done = tuple(sorted(r for r, b in self.beats.items() if b.exit == 0 and r not in alive))
        verdict = name({r: self.beats[r] for r in alive}, stacks, self._flight_recorder(), done)
        self._report(verdict, stacks, alive)
        action: Literal["stop", "report", "ended"] = "ended" if ended else "stop" if self.on_hang == "stop" else "report"
        self.hang.verdict = verdict
        self.hang.stacks, self.hang.named = len(stacks), now
        self.hang.action = action
        self.timeline.append(Event(kind="hang", what=self._summary(verdict), began=self.hang.began,
                                   detected=self.hang.detected, named=now, action=action,
                                   culprits=[c.rank for c in verdict.culprits]))
        if action == "stop":
            self._say(f"hang: stopping the job (--on-hang stop); it exits {HANG}")
            return "stop"
        return None

    def _flight_recorder(self) -> HangReport | None:
        """The hang analysis of the Flight Recorder dumps in the store, if any were written."""
        fr = self.observe / FLIGHT_RECORDER
        if not fr.is_dir() or not any(fr.glob("rank-*")):    # emptied when the hang was detected
            return None
        from hpcml.observe.hang import analyse
        try:
            return analyse(fr, world=self.world, prefix="rank-")
        except Exception:  # noqa: BLE001 - dumps are hostile input: fall back to the stacks
            return None

    def _summary(self, verdict: HangVerdict) -> str:
        if not verdict.culprits:
            return f"no culprit named: {verdict.note}"
        return (f"culprit ranks {ranges([c.rank for c in verdict.culprits])} ({verdict.method})"
                + (f"; ranks {ranges(verdict.blocked)} blocked behind them" if verdict.blocked else ""))

    def _report(self, verdict: HangVerdict, stacks: Mapping[int, Stack], alive: list[int]) -> None:
        for c in verdict.culprits:
            self._say(f"hang: culprit rank {c.rank} on {c.node}: {c.where or 'no stack'} ({c.why})")
        if verdict.blocked:
            one = len(verdict.blocked) == 1
            self._say(f"hang: {'rank' if one else 'ranks'} {ranges(verdict.blocked)} {'waits' if one else 'wait'}, "
                      f"blocked behind "
                      f"{ranges([c.rank for c in verdict.culprits])}")
        if not verdict.culprits:
            self._say(f"hang: no culprit named: {verdict.note}")
        missing = sorted(set(alive) - set(stacks))
        if missing:
            self._say(f"hang: no stack from ranks {ranges(missing)} (py-spy missing or not allowed to attach)")
