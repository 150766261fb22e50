"""``Checkpointer``: snapshot in the training loop, write in the background under a bytes/s
cap, commit atomically across ranks, tier local -> shared, and act on Slurm's time-limit
signal.

How it relates to ``torch.distributed.checkpoint`` (DCP): DCP's ``async_save`` stages to
CPU and writes from a thread with no rate control (the loop ran at 75-81 % during its write
here) and stores its metadata as a pickle of torch classes. hpcml keeps the same split
(blocking snapshot, background write) but paces the write, commits with one rename after
every rank reported, and keeps all metadata in JSON, so reading a checkpoint never needs
to unpickle torch classes. It does not reshard: a sharded checkpoint loads on the same
world size; a replicated one (``replicated=True``: rank 0 writes, every rank loads it)
loads on any. To reshard, load it and hand the state to ``dcp.save``.

Ranks: from ``torch.distributed`` when it is initialised, else ``RANK``/``WORLD_SIZE``
(torchrun, ``hpcml run``), else ``SLURM_PROCID``/``SLURM_NTASKS``, else one rank. Rank 0
commits. The ranks agree on which checkpoint to load through one ``all_reduce`` per
candidate when ``torch.distributed`` is up; without it each rank checks every shard's size
and its own shard's checksum.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hpcml import logs
from hpcml import signals as sigs
from hpcml.ckpt import layout, offline, owner
from hpcml.ckpt.flatten import ChecksumMismatch, CorruptShard, Leaf, PerRank, describe, flatten
from hpcml.ckpt.flatten import layout as place
from hpcml.ckpt.layout import CheckpointError
from hpcml.ckpt.pacer import copy_paced, write_paced
from hpcml.ckpt.prune import Pruned, prune
from hpcml.cluster import taskenv
from hpcml.cluster.ranks import initialised_dist, ranks, restart_count
from hpcml.errors import HpcmlError, UsageError
from hpcml.files import fsync_dir
from hpcml.units import parse_rate

FETCHING = ".fetch-"            # hpcml.ckpt.objtier's temporary directory of a fetch under way

log = logs.get(__name__)


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    who = ranks()
    return who.rank, who.world_size


def _attempt_token(world: int) -> str:
    """Something every rank of this run shares and a later run does not."""
    d = initialised_dist()
    if d is not None and world > 1:
        box = [uuid.uuid4().hex if d.get_rank() == 0 else None]
        d.broadcast_object_list(box, src=0)
        return str(box[0])
    env = os.environ
    if not env.get("HPCML_CKPT_TOKEN") and (task := taskenv.current(env)) is not None:
        # a farm's tasks share one Slurm job and restart count: the task's attempt tells them apart
        farm = hashlib.sha256(str(task.farm.absolute()).encode()).hexdigest()[:12]
        run = f".{env['TORCHELASTIC_RUN_ID']}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}" \
            if env.get("TORCHELASTIC_RUN_ID") else ""      # two runs in one attempt: two owners
        return f"farm-{farm}.{task.id}.{task.attempt}{run}"
    if env.get("HPCML_CKPT_TOKEN"):
        return f"{env['HPCML_CKPT_TOKEN']}."
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"{env['TORCHELASTIC_RUN_ID']}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if env.get("SLURM_JOB_ID"):
        return f"{env['SLURM_JOB_ID']}.{restart_count(env)}"
    if world > 1:
        raise UsageError("several ranks without torch.distributed or a run id: set HPCML_CKPT_TOKEN "
                         "to the same value on every rank", key="world_size")
    return uuid.uuid4().hex


class Checkpointer:
    """``ck = Checkpointer(dir, every=100, keep=3, local_dir=None, max_write_rate="500 MB/s")``.

    ``save(state, step)`` returns after the snapshot (tensors copied to a host buffer that is
    reused between saves) and writes in the background; ``wait()`` blocks until this rank's
    write (and, on rank 0, the commit) is done; ``load_latest()`` returns ``(state, step)``
    of the newest complete checkpoint, or ``(None, None)``. ``maybe_save(state, step)`` saves
    every ``every`` steps and, once SIGUSR1 or SIGTERM arrived (``#SBATCH --signal=USR1@300``,
    preemption), takes a final checkpoint at a step every rank agrees on (``_stop_now``),
    waits for it, requeues the job when ``requeue=True`` and sets ``stopping``.

    One job writes a directory: a second writer is refused (``hpcml.ckpt.owner``) unless
    ``take_over=True``; ``read_only=True`` opens it to load only (an evaluation beside the
    training). Files are created ``mode`` (0600, directories 0700: they hold the model's
    weights). ``close()`` (or leaving a ``with`` block) gives back the signal handlers it
    replaced and the directory. ``object_store="s3://bucket/prefix"`` adds the object tier
    (``hpcml.ckpt.objtier``): each commit pushed there, the manifest last, and fetched back
    by ``load_latest`` when the directory lost its checkpoints.
    """

    def __init__(self, directory: str | os.PathLike, every: int | None = None, keep: int = 3,
                 local_dir: str | os.PathLike | None = None, max_write_rate: str | float | None = "500 MB/s",
                 *, replicated: bool = False, requeue: bool = False,
                 signals: tuple[str, ...] = ("SIGUSR1", "SIGTERM"), rank: int | None = None,
                 world_size: int | None = None, commit_timeout: float = 600.0, stop_lead: int = 10,
                 mode: int = layout.FILE_MODE, take_over: bool = False, read_only: bool = False,
                 object_store: str | None = None) -> None:
        if keep < 1:
            raise UsageError(f"keep must be at least 1, not {keep}", key="keep")
        if every is not None and every < 1:
            raise UsageError(f"every must be at least 1, not {every}", key="every")
        self.dir = Path(directory)
        self.local = Path(local_dir) if local_dir else None
        self.every, self.keep, self.replicated, self.requeue = every, keep, replicated, requeue
        if isinstance(max_write_rate, str) and max_write_rate.strip().lower() in ("0", "none", "unlimited"):
            max_write_rate = None               # no cap
        try:
            self.rate = parse_rate(max_write_rate) if isinstance(max_write_rate, str) else max_write_rate
        except ValueError as exc:
            raise UsageError(str(exc), key="max_write_rate") from None
        self.rank, self.world = _rank_world(rank, world_size)
        # the object-storage tier (hpcml.ckpt.objtier): rank 0 pushes each commit; any rank fetches
        # when the shared tier lost them. A missing bucket or refused credentials: refused now.
        self.tier = None
        if object_store:
            from hpcml.ckpt.objtier import ObjectTier
            self.tier = ObjectTier(object_store, self.rate)
        self.tier_problem: str | None = None     # the last push that failed (the local commit stands)
        self.commit_timeout = commit_timeout
        self.mode, self.read_only = mode, read_only
        if read_only:
            if not self.dir.is_dir():
                raise UsageError("no such directory", file=str(self.dir))
        else:
            layout.make_dir(self.dir, mode)
        if any(not p.name.startswith((owner.OWNER, FETCHING)) for p in self.dir.iterdir()) \
                and not layout.is_checkpoint_dir(self.dir):    # .owner*: also a claim cut short by kill -9
            raise UsageError("not a checkpoint directory (it holds other files and no step-*/)",
                             file=str(self.dir))
        # a reader writes nothing that ranks must share (no partials, no stop file): its own
        # token, so one process can open any rank of a checkpoint without a run id
        self.token = uuid.uuid4().hex if read_only else _attempt_token(self.world)
        if not read_only:
            self._claim(take_over or os.environ.get("HPCML_CKPT_TAKE_OVER", "") not in ("", "0"))
        self._host: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closing = False
        self._committed: int | None = None      # the step rank 0 last renamed into place
        self._per_rank = False                  # the save under way has per-rank values
        self.stop_signal: str | None = None     # the signal's name; "peer" when another rank had it
        self.stopping = False
        self.stop_lead = stop_lead               # steps between the first signal and the final save
        self._stop_step: int | None = None
        self.skipped: list[str] = []         # checkpoints load_latest passed over, and why
        self.last_blocking_s = 0.0
        self.last_durable_s = 0.0
        self._checked: dict[tuple[str, float], list[str]] = {}     # checkpoints verified by this process
        self._reported: set[str] = set()
        self._handlers: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread() and not read_only:
            self._handlers = sigs.install([getattr(signal, name) for name in signals], self._on_signal)

    def _claim(self, take_over: bool) -> None:
        """Rank 0 claims the directory (``hpcml.ckpt.owner``), puts back a re-save cut short
        and clears dead attempts' partials. Under torch.distributed every rank learns of a
        refusal and raises it too, instead of waiting for rank 0 in a collective."""
        refusal: UsageError | None = None
        if self.rank == 0:
            try:
                owner.claim(self.dir, self.token, mode=self.mode, take_over=take_over)
                layout.restore_replaced(self.dir)
                prune(self.dir, None, live_token=self.token)
            except UsageError as exc:
                refusal = exc
        d = initialised_dist()
        if d is not None and self.world > 1:
            box = [str(refusal) if refusal else None]
            d.broadcast_object_list(box, src=0)
            if box[0] and refusal is None:
                refusal = UsageError(box[0])
        if refusal is not None:
            raise refusal

    # -- signals ------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        # the first one says why it stops: the requeue's own TERM (``scontrol requeue`` ends
        # the job while rank 0 is still returning from it) must not rename the warning
        self.stop_signal = self.stop_signal or signal.Signals(signum).name

    @property
    def _stop_file(self) -> Path:
        return self.dir / f".stop-{self.token}"

    def _stop_now(self, step: int) -> bool:
        """Whether every rank takes its final checkpoint at ``step``.

        The signal reaches each rank at its own moment: one may see it before step 5 and
        another only after, and a rank that stops alone leaves a checkpoint that never
        commits (and, under DDP, the others hang in their next collective). So the step is
        agreed. With torch.distributed: a one-element all-reduce (MAX) of "a signal came"
        at every call, as Lightning does; every rank gets the same answer at the same step.
        Without it (ranks that share no collective): the first rank to see the signal at
        step s names ``s + stop_lead`` in ``DIR/.stop-TOKEN`` (created exclusively, so the
        first one wins) and each rank stops there once it has its own signal; only ranks
        that had a signal look, so a step costs no file-system metadata call."""
        if self.stopping:
            return False
        if self.world == 1:
            return self.stop_signal is not None
        d = initialised_dist()
        if d is not None:
            import torch
            dev = torch.device("cuda", torch.cuda.current_device()) if d.get_backend() == "nccl" else "cpu"
            flag = torch.tensor([1 if self.stop_signal else 0], dtype=torch.int32, device=dev)
            d.all_reduce(flag, op=d.ReduceOp.MAX)
            agreed = bool(flag.item())
            if agreed and self.stop_signal is None:
                self.stop_signal = "peer"
            return agreed
        if self.stop_signal is None:
            return False
        if self._stop_step is None:
            path = self._stop_file
            try:
                with os.fdopen(layout.create(path, self.mode, os.O_EXCL), "w") as fh:
                    fh.write(f"{step + self.stop_lead}\n")
            except FileExistsError:
                pass
            try:
                self._stop_step = int(path.read_text())
            except (OSError, ValueError):
                return False                    # being written by the rank that won: next step
        return step >= self._stop_step

    def maybe_save(self, state: Any | Callable[[], Any], step: int) -> bool:
        """Save when ``step`` is due or every rank agreed to stop here (a stop signal
        arrived; see ``_stop_now``); True if it saved."""
        final = self._stop_now(step)
        if not final and not (self.every and step % self.every == 0):
            return False
        self.save(state() if callable(state) else state, step)
        if final:
            self.wait()
            self.stopping = True
            if self.rank == 0:          # committed: every rank has read the agreed step
                self._stop_file.unlink(missing_ok=True)
                if self.requeue:
                    self._requeue()
        return True

    def _requeue(self) -> None:
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            log.warning("hpcml ckpt: requeue asked but not in a Slurm job")
            return
        from hpcml.cluster import requeue, slurm
        # under hpcml run: the run's record and report say "requeued", not "rank failed (143)"
        marker = requeue.note(self._committed, self.stop_signal, self.dir)
        try:
            slurm.run(["scontrol", "requeue", job], timeout=30)
        except BaseException:
            requeue.withdraw(marker)
            raise

    # -- save ---------------------------------------------------------------------------
    def save(self, state: Any, step: int) -> None:
        """Snapshot ``state`` and write it in the background (the previous save is waited for
        first: its host buffer is reused). Replicated: rank 0 writes the state once, and
        each rank its own values (``PerRank``, data-loader states) beside it."""
        entered = time.perf_counter()
        try:
            self._save(state, step)
        finally:
            _record_blocking(time.perf_counter() - entered)

    def _save(self, state: Any, step: int) -> None:
        self.wait()
        if self.read_only:
            raise UsageError("opened read_only: it loads, it does not save", file=str(self.dir))
        t0 = time.perf_counter()
        own: list[PerRank] | None = [] if self.replicated else None
        parts: list[tuple[str, Any, list[Leaf]]] = []
        if self.replicated and self.rank != 0:
            flatten(state, own, leaves_too=False)      # only this rank's own values
        else:
            parts.append(("rank", *flatten(state, own)))
        if own:
            parts.append(("own", *flatten([p.value for p in own])))
        if not parts:
            return
        sizes = [place(leaves) for _kind, _skeleton, leaves in parts]
        host = self._buffer(sum(sizes), any(getattr(f.value, "is_cuda", False) for p in parts for f in p[2]))
        cuda: set[Any] = set()                  # the devices copies were started from
        base = 0
        writes = []
        try:
            for (kind, skeleton, leaves), size in zip(parts, sizes):
                _zero_gaps(host[base:base + size], leaves)
                for f in leaves:
                    dst = host[base + f.offset:base + f.offset + f.nbytes]
                    if f.kind == "torch":
                        import torch
                        t = f.value
                        if t.is_cuda:
                            cuda.add(t.device)
                        if f.nbytes:
                            torch.from_numpy(dst).copy_(t.contiguous().view(-1).view(torch.uint8),
                                                        non_blocking=t.is_cuda)
                    elif f.kind == "numpy":
                        dst[:] = np.ascontiguousarray(f.value).reshape(-1).view(np.uint8)
                    else:
                        dst[:] = np.frombuffer(f.value, dtype=np.uint8)
                doc = {"schema": layout.SHARD_TAG, "step": step, "rank": self.rank, "world_size": self.world,
                       "replicated": self.replicated, "token": self.token, "size": size,
                       "skeleton": skeleton, "entries": describe(leaves)}
                if kind == "own":
                    doc["part"] = "own"
                writes.append((*layout.shard_names(self.rank, kind), host[base:base + size].data, doc))
                base += size
        finally:          # every device's copies, not the current one's alone (a state over several
            if cuda:      # GPUs); also when a leaf failed: none may land in the buffer's next use
                import torch
                for device in cuda:
                    torch.cuda.synchronize(device)
        self.last_blocking_s = time.perf_counter() - t0
        self._error = None
        self._committed = None
        self._per_rank = bool(own)
        self._thread = threading.Thread(target=self._background, args=(step, writes, time.monotonic()),
                                        name=f"hpcml-ckpt-{step}", daemon=True)
        self._thread.start()

    def _buffer(self, size: int, pinned: bool) -> np.ndarray:
        """The host staging buffer, reused from save to save: its bytes are whatever the
        allocator or the last save left, so every byte a shard holds besides its leaves
        (their alignment padding) is zeroed at each save (``_zero_gaps``)."""
        if self._host is None or len(self._host) < size:
            cap = max(size, 1)
            if pinned:
                import torch
                self._host = torch.empty(cap, dtype=torch.uint8, pin_memory=True).numpy()
            else:
                self._host = np.empty(cap, dtype=np.uint8)
        return self._host

    def _background(self, step: int, writes: list[tuple[str, str, memoryview, dict[str, Any]]],
                    started: float) -> None:
        try:
            try:
                self._write(step, writes)
            except FileNotFoundError:            # a dead attempt's partial at this step, pruned
                self._write(step, writes)        # under us by rank 0: once more, in a new one
            self.last_durable_s = time.monotonic() - started
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait() in the training thread
            self._error = exc
            self._give_back(step, [name for bin_name, json_name, _v, _d in writes for name in (bin_name, json_name)])

    def _give_back(self, step: int, names: list[str]) -> None:
        """After a failed save (a full disk): remove what this rank's attempt wrote: its
        temporary files, its files of a step that will not be committed (the manifest did
        not fit), and the directories that then hold nothing but this attempt's mark, so
        that a failed save leaves nothing behind."""
        partial = self.dir / layout.partial_name(step)
        local = self.local / layout.step_name(step) if self.local else None
        for d in (partial, local):
            if d is not None:
                for name in [*names, layout.MANIFEST]:
                    (d / (name + ".tmp")).unlink(missing_ok=True)
        mark = layout.attempt_mark(self.token)
        if self._committed == step or partial.is_symlink() or not (partial / mark).exists():
            return
        for name in names:                       # complete but never to be committed
            (partial / name).unlink(missing_ok=True)
        if local is not None:
            for name in names:
                (local / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                local.rmdir()                    # only if nothing else is in it
        with contextlib.suppress(OSError):
            if [p.name for p in partial.iterdir()] == [mark]:     # other ranks' files stay
                (partial / mark).unlink()
                partial.rmdir()

    def _write(self, step: int, writes: list[tuple[str, str, memoryview, dict[str, Any]]]) -> None:
        partial = self.dir / layout.partial_name(step)
        layout.make_dir(partial, self.mode)
        os.close(layout.create(partial / layout.attempt_mark(self.token), self.mode))
        stop = lambda: self._closing  # noqa: E731
        mode = self.mode
        for bin_name, json_name, view, doc in writes:
            if self.local is not None:
                local = self.local / layout.step_name(step)
                layout.make_dir(local, mode)
                doc["crc32"] = write_paced(str(local / (bin_name + ".tmp")), view, None, should_stop=stop, mode=mode)
                os.replace(local / (bin_name + ".tmp"), local / bin_name)
                layout.write_json_durably(local / json_name, doc, mode)      # the same document as the shared one
                if copy_paced(str(local / bin_name), str(partial / (bin_name + ".tmp")), self.rate,
                              should_stop=stop, mode=mode) != doc["crc32"]:
                    raise CheckpointError(f"{local / bin_name}: changed while it was drained to {partial}")
            else:
                doc["crc32"] = write_paced(str(partial / (bin_name + ".tmp")), view, self.rate, should_stop=stop,
                                           mode=mode)
            os.replace(partial / (bin_name + ".tmp"), partial / bin_name)
            layout.write_json_durably(partial / json_name, doc, mode)
        if self.rank == 0:
            self._commit(step, partial)
            if self.tier is not None:
                self._push(step)

    def _push(self, step: int) -> None:
        """The committed step to the object tier, then its pruning there. A store that keeps
        failing (after boto3's retries) is said, and training goes on: the commit stands."""
        assert self.tier is not None
        try:
            self.tier.push(self.dir / layout.step_name(step), step)
            self.tier.prune(self.keep)
            self.tier_problem = None
        except Exception as exc:  # noqa: BLE001 - the store's trouble never undoes the commit
            self.tier_problem = str(exc) if isinstance(exc, HpcmlError) else f"{type(exc).__name__}: {exc}"
            log.warning(f"hpcml ckpt: step {step} not pushed to the object store: {self.tier_problem}")

    def _commit(self, step: int, partial: Path) -> None:
        """Wait for every rank's files of this attempt (a replicated state: rank 0's shard,
        and each rank's own values when it has any), write the manifest, rename."""
        wanted = [("rank", r) for r in ([0] if self.replicated else range(self.world))]
        if self._per_rank:
            wanted += [("own", r) for r in range(self.world)]
        deadline = time.monotonic() + self.commit_timeout
        records: dict[tuple[str, int], dict[str, Any]] = {}
        while len(records) < len(wanted):
            for kind, r in wanted:
                if (kind, r) in records:
                    continue
                bin_name, json_name = layout.shard_names(r, kind)
                try:
                    shard = layout.read_json(partial / json_name, layout.SHARD_TAG)
                except UsageError:
                    continue
                if shard.get("token") != self.token or shard.get("step") != step:
                    continue                     # left by a crashed attempt at this step
                records[(kind, r)] = {"size": shard["size"], "crc32": shard["crc32"],
                                      "json_size": (partial / json_name).stat().st_size,
                                      "json_crc32": layout.file_crc(partial / json_name)}
            if len(records) < len(wanted):
                if time.monotonic() > deadline or self._closing:
                    late = sorted({r for w in wanted if w not in records for r in w[1:]})
                    raise CheckpointError(f"{partial}: ranks {late} did not report within "
                                          f"{self.commit_timeout:g} s; not committed")
                time.sleep(0.05)
        committed_at = time.time()
        manifest = {"schema": layout.TAG, "step": step, "world_size": self.world, "replicated": self.replicated,
                    "token": self.token, "committed_at": committed_at,
                    "ranks": {str(r): rec for (kind, r), rec in records.items() if kind == "rank"}}
        if self._per_rank:
            manifest["per_rank"] = {str(r): rec for (kind, r), rec in records.items() if kind == "own"}
        layout.write_json_durably(partial / layout.MANIFEST, manifest, self.mode)
        owner.check(self.dir, self.token)    # taken over meanwhile: the new owner's directory now
        final = self.dir / layout.step_name(step)
        if final.exists():                   # the same step saved again: replace it whole; a crash
            old = self.dir / f".old-{layout.step_name(step)}-{self.token}"   # between the renames
            shutil.rmtree(old, ignore_errors=True)     # leaves .old, which layout.scan loads as step N
            os.rename(final, old)
            os.rename(partial, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(partial, final)
        self._committed = step
        fsync_dir(self.dir)
        self._checked[(self.token, committed_at)] = []
        self.prune()

    def wait(self) -> None:
        """Block until the background write (and, on rank 0, the commit) is done; re-raise
        its error here, in the training thread."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            exc, self._error = self._error, None
            if isinstance(exc, HpcmlError):
                raise exc
            raise CheckpointError(f"{self.dir}: background write failed: {exc}") from exc

    def close(self) -> None:
        """Wait for the last write; give back the signal handlers and the directory."""
        try:
            self.wait()
        finally:
            self._give_back_handlers()
            self._handlers = {}
            if self.rank == 0 and not self.read_only:
                owner.release(self.dir, self.token, self.mode)

    #: (signal, closed Checkpointer's handler) -> the handler it had replaced, for a close out
    #: of order: a, b opened, a closed, b closed put back a's handler (b had replaced it), and
    #: SIGTERM went on to a closed Checkpointer instead of the caller's handler
    _retired: dict[tuple[int, Any], Any] = {}

    def _give_back_handlers(self) -> None:
        for sig, previous in self._handlers.items():
            while (sig, previous) in Checkpointer._retired:      # a Checkpointer closed before us
                previous = Checkpointer._retired.pop((sig, previous))
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, previous)
            else:                # replaced after us: whoever did gets ``previous`` when it closes
                Checkpointer._retired[(sig, self._on_signal)] = previous

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def prune(self) -> Pruned:
        """Keep the newest ``keep`` checkpoints that verify, remove older ones and dead
        attempts' partial ones (``hpcml.ckpt.prune``); what it skips goes to stderr once.
        Each checkpoint is read to verify it once per process, not at every commit. A
        ``read_only`` reader does not prune: its keep and token are not the writer's (it
        would remove the writer's kept checkpoints and the partial it is filling)."""
        if self.read_only:
            raise UsageError("opened read_only: it loads, it does not prune (hpcml ckpt prune does, "
                             "leaving a running owner's partial alone)", file=str(self.dir))
        done = prune(self.dir, self.keep, local=self.local, verified=self._verified, live_token=self.token)
        for line in done.skipped:
            if line not in self._reported:
                self._reported.add(line)
                log.warning(f"hpcml ckpt: prune skipped {line}")
        return done

    def _verified(self, found: layout.Found) -> list[str]:
        if not found.manifest:
            return layout.verify(found)
        key = (found.manifest["token"], float(found.manifest["committed_at"]))
        if key not in self._checked:
            self._checked[key] = layout.verify(found)
        return self._checked[key]

    # -- load ---------------------------------------------------------------------------
    def load_latest(self, map_location: Any = "cpu") -> tuple[Any, int | None]:
        """The newest checkpoint complete on every rank: ``(state, step)``; ``(None, None)``
        when there is none. Incomplete or corrupt ones are skipped and named in ``skipped``
        (and on stderr). A checkpoint that vanished while it was read (a writer's prune
        beside a ``read_only`` reader) is not skipped as corrupt: the directory is scanned
        again, since a newer one was committed meanwhile."""
        fetched: set[int] = set()
        if self.tier is not None:
            self._fetch(fetched, newer_only=True)        # the store holds a newer one than the directory
        for _ in range(1000):
            done, result = self._load_newest(map_location)
            if done and result[1] is None and self.tier is not None:
                step = self._fetch(fetched)
                if step is not None:                     # the shared tier lost them: the store's newest
                    continue
            if done:
                if result[1] is not None and self.rank == 0 and not self.read_only:
                    from hpcml.cluster import requeue  # under hpcml run: the restart's steps lost
                    requeue.note_resumed(result[1], self.dir)
                return result
        raise CheckpointError(f"{self.dir}: its checkpoints keep being removed while they are read")

    def _fetch(self, tried: set[int], newer_only: bool = False) -> int | None:
        """The newest whole checkpoint of the object tier not tried yet (``newer_only``: only
        if newer than the directory's newest), fetched into the directory; None when there is
        none. Under torch.distributed rank 0 fetches and every rank learns whether it did;
        otherwise each rank fetches (the first rename stands). A step the store cannot give
        is said, and the one before it tried."""
        assert self.tier is not None
        d = initialised_dist()
        alone = d is None or self.world == 1
        step: int | None = None
        if alone or self.rank == 0:
            step = self._fetch_here(tried, newer_only)
        if alone:
            return step
        said: list[Any] = [None] * self.world
        d.all_gather_object(said, step)
        if said[0] is not None:
            tried.add(said[0])
        return said[0]

    def _fetch_here(self, tried: set[int], newer_only: bool) -> int | None:
        assert self.tier is not None
        local = [f for f in layout.scan(self.dir) if f.committed]
        newest_here = max((f.step for f in local), default=-1)
        try:
            remote = self.tier.steps()
        except HpcmlError as exc:
            log.warning(f"hpcml ckpt: the object store was not listed: {exc}")
            return None
        for step in reversed(remote):
            if step in tried or (newer_only and step <= newest_here):
                continue
            tried.add(step)
            try:
                self.tier.fetch(step, self.dir, self.mode, replace=True)
            except HpcmlError as exc:
                log.warning(f"hpcml ckpt: step {step} not fetched from {self.tier.url}: {exc}; trying the one before")
                continue
            log.warning(f"hpcml ckpt: fetched step {step} from {self.tier.url} into {self.dir}")
            return step
        return None

    def _load_newest(self, map_location: Any) -> tuple[bool, tuple[Any, int | None]]:
        """One pass, newest first: (True, result), or (False, _) when a candidate vanished."""
        for found in reversed([f for f in layout.scan(self.dir) if f.committed]):
            ok, why, sources = self._usable(found)
            if not self._agree(ok):
                if not self._agree(found.path.exists()):        # pruned under us: scan again
                    return False, (None, None)
                why = why or "another rank's shard is missing or corrupt"
            elif ok:
                assert found.manifest is not None
                refused: UsageError | None = None
                leaf: CorruptShard | CheckpointError | None = None
                try:
                    state = self._read(sources, found, map_location)
                except offline.ResizeRefused as exc:
                    refused = exc
                except (CorruptShard, CheckpointError) as exc:     # never loaded (bytes not the checksummed ones,
                    # an index that does not describe its shard or a place its own file lacks, a refused leaf,
                    # bytes that do not rebuild, a file replaced by a link): every rank takes the one before
                    leaf = exc
                except (FileNotFoundError, UsageError):
                    if found.path.exists() or (initialised_dist() is not None and self.world > 1):
                        raise
                    return False, (None, None)                  # pruned between verify and read
                if not self._agree(leaf is None):     # every rank falls back together
                    why = str(leaf) if leaf else "another rank's pickled leaf was refused"
                    self.skipped.append(f"{found.path}: {why}")
                    log.warning(f"hpcml ckpt: skipped {found.path}: {why}; trying the checkpoint before it")
                    continue
                if "per_rank" in found.manifest and found.manifest["world_size"] != self.world:
                    refused = self._agree_refusal(refused)      # every rank stops, none waits in a collective
                if refused is not None:
                    raise refused
                if len(layout.shards(found.manifest)) == 1:    # its one shard's crc32 checked: verified
                    self._checked[(found.manifest["token"], float(found.manifest["committed_at"]))] = []
                return True, (state, found.step)
            self.skipped.append(f"{found.path}: {why}")
            log.warning(f"hpcml ckpt: skipped {found.path}: {why}; trying the checkpoint before it")
        return True, (None, None)

    def _usable(self, found: layout.Found) -> tuple[bool, str, dict[tuple[str, int], Path]]:
        """Whether this rank can load ``found``: every file's size (the crc32s and indexes
        of the files it reads, its shard or rank 0's of a replicated one and its own values,
        are judged on the read that loads them: ``offline.read_state``); each read from this
        node's copy when its sizes are right (the shared copy when its bytes are not: ``_read``).
        At another world size a replicated checkpoint's own values are those of rank
        ``rank % saved``."""
        if found.problems or not found.manifest:
            return False, "; ".join(found.problems) or "no manifest", {}
        man = found.manifest
        if not man["replicated"] and man["world_size"] != self.world:
            raise UsageError(f"a checkpoint of world size {man['world_size']}; this job has {self.world} ranks "
                             "(a sharded checkpoint loads on the same world size)", file=str(found.path / layout.MANIFEST),
                             key="world_size")
        mine = [("rank", 0 if man["replicated"] else self.rank)]
        if "per_rank" in man:
            mine.append(("own", self.rank % man["world_size"]))
        records = {(kind, r): rec for kind, r, rec in layout.shards(man)}
        for kind, r in mine:
            if (kind, r) not in records:
                return False, f"no {'shard' if kind == 'rank' else 'per-rank values'} for rank {r}", {}
        for (kind, r), rec in records.items():      # every file's size: cheap, the same answer on every rank
            problems = [] if (kind, r) in mine else \
                layout.verify_shard(found.path, r, rec, checksums=False, kind=kind, index=False)
            if problems:
                return False, problems[0], {}
        sources = {}
        for kind, r in mine:
            rec = records[(kind, r)]
            if self.local is not None:               # this node's copy first, if it is intact
                local = self.local / layout.step_name(found.step)
                if (local / layout.shard_names(r, kind)[0]).exists() and \
                        not layout.verify_shard(local, r, rec, kind=kind, checksums=False, index=False):
                    sources[(kind, r)] = local
                    continue
            problems = layout.verify_shard(found.path, r, rec, kind=kind, checksums=False, index=False)
            if problems:
                return False, problems[0], {}
            sources[(kind, r)] = found.path
        return True, "", sources

    def _agree(self, ok: bool) -> bool:
        d = initialised_dist()
        if d is None or self.world == 1:
            return ok
        import torch
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        d.all_reduce(flag, op=d.ReduceOp.MIN)
        return bool(flag.item())

    def _agree_refusal(self, refused: UsageError | None) -> UsageError | None:
        """Under torch.distributed: a refusal on any rank is every rank's (the first one's
        message), so that no rank goes on into a collective that the others never reach."""
        d = initialised_dist()
        if d is None or self.world == 1:
            return refused
        said: list[Any] = [None] * self.world
        d.all_gather_object(said, str(refused) if refused is not None else None)
        first = next((m for m in said if m), None)
        if refused is None and first is not None:
            return offline.ResizeRefused(first)
        return refused

    def _read(self, sources: dict[tuple[str, int], Path], found: layout.Found, map_location: Any) -> Any:
        """The state from ``sources``; the files this node's copy holds, when their bytes
        prove not to be the checksummed ones on the read, from the shared copy instead."""
        try:
            return self._read_from(sources, found, map_location)
        except ChecksumMismatch as exc:
            local = {k for k, d in sources.items() if d != found.path and Path(exc.path).parent == d}
            if not local:
                raise
            assert found.manifest is not None
            for kind, r in local:
                problems = layout.verify_shard(found.path, r, layout.record(found.manifest, kind, r),
                                               kind=kind, checksums=False, index=False)
                if problems:
                    raise CorruptShard(f"{exc}; the shared copy: {problems[0]}") from None
            log.warning(f"hpcml ckpt: {exc}; reading the shared copy {found.path}")
            return self._read_from({k: found.path for k in sources}, found, map_location)

    def _read_from(self, sources: dict[tuple[str, int], Path], found: layout.Found, map_location: Any) -> Any:
        man = found.manifest
        assert man is not None
        (_, shard), directory = next((k, v) for k, v in sources.items() if k[0] == "rank")
        own = next(((r, d) for (kind, r), d in sources.items() if kind == "own"), None)

        def values(slots: list[dict[str, Any]]) -> list[Any]:
            assert own is not None
            mine = offline.read_own(own[1], own[0], map_location, rec=layout.record(man, "own", own[0]))
            return offline.resolve_own(mine, slots, man["world_size"], self.world, str(found.path / layout.MANIFEST))
        return offline.read_state(directory, shard, map_location, own=values if own is not None else None,
                                  rec=layout.record(man, "rank", shard))

    def load(self, step: int | None = None, *, rank: int | None = None, map_location: Any = "cpu") -> tuple[Any, int]:
        """``(state, step)`` of one committed checkpoint (default: the newest), read by this
        process alone: an evaluation or an export after the job, on any number of processes.
        ``rank``: whose shard of a sharded checkpoint (default: this process's rank when the
        world sizes match); a replicated one needs none. Checked like ``load_latest``; a
        corrupt one raises instead of being skipped (``hpcml.ckpt.offline``)."""
        if rank is None:
            found = offline.find(self.dir, step)
            if found.manifest and found.manifest["world_size"] == self.world:
                rank = self.rank
        return offline.load(self.dir, step, rank=rank, map_location=map_location)


def _record_blocking(seconds: float) -> None:
    """Under ``hpcml run``: the seconds a save held the training loop (waiting for the last
    write, then the snapshot), as the ``checkpoint`` section its time ledger splits out."""
    from hpcml.observe import api
    if api.under_run():
        api.blocked(api.CHECKPOINT, seconds)


def _zero_gaps(part: np.ndarray, leaves: list[Leaf]) -> None:
    """Zero the bytes of one shard's part of the staging buffer that no leaf fills: the 4 KiB
    alignment padding after each leaf. ``np.empty``'s (or pinned memory's) bytes there went
    into the file as they were: the process's heap (pointers, whatever it last held) written
    to disk, and, read as a pickle by a scan of the whole file, sometimes an opcode that made
    a benign checkpoint ``unknown``."""
    at = 0
    for f in sorted(leaves, key=lambda leaf: leaf.offset):
        if f.offset > at:
            part[at:f.offset] = 0
        at = max(at, f.offset + f.nbytes)
    if len(part) > at:
        part[at:] = 0
