"""A differential harness for the scanner (issue 62 item 2): mutate files made by their
real producers, scan each input, and load every input the scan calls ``safe`` with the real
loader in a forked child with its address space and time capped, instrumented to record
every ``find_class`` and ``persistent_load``. An input the scan calls safe whose load
imports a global the scan did not report, dies by a signal, runs out of memory or time, is
a failure, kept as a regression file.

Kinds of input and their real loaders: a pickle (CPython's C ``pickle.Unpickler``), a
joblib file (joblib's ``NumpyUnpickler``), a torch zip (``torch.load(weights_only=False)``
with the recording unpickler as its pickle module; torch answers the persistent ids), an
``.npz`` (``numpy.load(allow_pickle=True)``, every member read) and a WebDataset tar
(``tarfile`` and ``pickle.loads`` of each ``.pyd``/``.pickle`` member, as WebDataset's
default decoder does). Archives are mutated in two ways: a member's pickle mutated and the
archive written again (valid CRCs, so the mutation reaches the loader), or the archive's
own bytes. A persistent id that pickle's or joblib's unpickler is handed is recorded and
refused, as those loaders do: not a failure.

The child never runs what it records: its ``find_class`` returns only what the scan's
policy allows and refuses the rest after recording it (a mutation that spells ``os.system``
is a finding, not an execution). Mutation strategies after Cisco's pickle-fuzzer and
fickling's bypass tests (read, not copied): byte flips, opcode swaps, memo indices pushed
far out, numpy dtype flags, truncation, splices of two seeds, duplicated and dropped spans,
short spans repeated up to 300,000 times (a tuple nested too deep to hash was found so).
"""

from __future__ import annotations

import faulthandler
import io
import json
import os
import pickle
import random
import resource
import signal
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

#: the memory and time a load may take before it counts as a failure
CHILD_MEMORY = 512 << 20
CHILD_SECONDS = 5.0

#: opcodes a mutation may put in place of another (every opcode pickle protocol 5 has)
OPCODES = bytes(sorted(set(b"()012FGIJKLMNPQRSTUVXabcdeghijlopqrstu}~") | set(range(0x80, 0x99))))


#: how often each kind of file is drawn (the rest 1): plain pickles have the most shapes
KIND_WEIGHT = {"pickle": 3}


@dataclass
class Seed:
    """A file as its producer wrote it: ``kind`` names the loader; ``members`` its pickles
    by archive member ("" for a file that is one pickle stream)."""

    name: str
    kind: str
    members: dict[str, bytes]

    @property
    def suffix(self) -> str:
        return {"joblib": ".joblib", "torch": ".pt", "npz": ".npz", "tar": ".tar"}.get(self.kind, ".pkl")


def build(kind: str, members: dict[str, bytes]) -> bytes:
    """The file of ``kind`` holding ``members`` (archives written again with valid CRCs)."""
    if kind in ("pickle", "joblib"):
        return members[""]
    buf = io.BytesIO()
    if kind == "tar":
        import tarfile
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 1764115200
                tf.addfile(info, io.BytesIO(data))
        return buf.getvalue()
    import zipfile
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _zip_members(data: bytes) -> dict[str, bytes]:
    import zipfile
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def seeds() -> list[Seed]:
    """Files as their producers write them: pickle (every protocol), numpy (``.npz`` by
    ``numpy.savez``), joblib, ``torch.save``'s zip, a WebDataset tar of pickled fields."""
    import joblib
    import numpy as np
    objs = {
        "plain": {"a": [1, 2.5, "x", b"y", None, True], "t": (1, (2, 3)), "s": {1, 2}, "f": frozenset({3}),
                  (1, ((2,),)): {((3,), 4)}},
        "nested": [{"k": i, "v": [str(i)] * 3} for i in range(40)],
        "stdlib": [OrderedDict(a=1), Fraction(1, 3), bytearray(b"ab"), complex(1, 2)],
        "numpy": [np.arange(6, dtype="f8").reshape(2, 3), np.dtype("U10"), np.float32(1.5), np.array(["a", 1], dtype=object),
                  np.zeros(2, dtype=[("a", "<f4"), ("b", "O")]), np.datetime64("2026-11-26", "ns")],
    }
    out = []
    for name, obj in objs.items():
        for proto in range(6):
            out.append(Seed(f"{name}-p{proto}", "pickle", {"": pickle.dumps(obj, protocol=proto)}))
    for name in ("numpy", "plain"):
        buf = io.BytesIO()
        joblib.dump(objs[name], buf)
        out.append(Seed(f"{name}.joblib", "joblib", {"": buf.getvalue()}))
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(3), o=np.array([{"k": 1}, "s", None], dtype=object))
    out.append(Seed("arrays.npz", "npz", _zip_members(buf.getvalue())))
    out.append(Seed("shard.tar", "tar", {f"{k:06d}.{f}": pickle.dumps(v, protocol=4) for k in range(2)
                                          for f, v in (("pyd", objs["plain"]), ("pickle", objs["stdlib"]))}))
    try:
        import torch
    except ImportError:
        return out
    buf = io.BytesIO()
    torch.save({"w": torch.arange(6.0).reshape(2, 3), "b": torch.zeros(2, dtype=torch.int64), "step": 3,
                "opt": {"lr": 0.1, "betas": (0.9, 0.99)}}, buf)
    out.append(Seed("state.pt", "torch", _zip_members(buf.getvalue())))
    return out


def mutate(rng: random.Random, data: bytes, other: bytes) -> bytes:
    """One mutation of ``data`` (``other``: a second seed, for splices)."""
    b = bytearray(data)
    kind = rng.randrange(10)
    if not b:
        return bytes(b)
    i = rng.randrange(len(b))
    if kind == 0:                                        # a flipped byte
        b[i] ^= 1 << rng.randrange(8)
    elif kind == 1:                                      # an opcode in place of a byte
        b[i] = rng.choice(OPCODES)
    elif kind == 2:                                      # a memo index far out
        at = [j for j, c in enumerate(b) if c in (0x71, 0x68, 0x72, 0x6A)] or [i]
        j = rng.choice(at)
        if b[j] in (0x72, 0x6A) and j + 5 <= len(b):
            b[j + 1:j + 5] = rng.choice([0xFFFFFFFF, 0x7FFFFFFF, 1 << 20, 300]).to_bytes(4, "little")
        elif j + 2 <= len(b):
            b[j + 1] = rng.randrange(256)
    elif kind == 3:                                      # a dtype's flags
        j = b.find(b"J\xff\xff\xff\xffJ\xff\xff\xff\xffK")
        if j >= 0 and j + 12 <= len(b):
            b[j + 11] = rng.choice([0, 1, 16, 27, 63, 255])
    elif kind == 4:                                      # truncated
        del b[i:]
    elif kind == 5:                                      # a span of another seed spliced in
        k = rng.randrange(len(other)) if other else 0
        b[i:i] = other[k:k + rng.randrange(1, 64)]
    elif kind == 6:                                      # a span duplicated
        n = rng.randrange(1, 32)
        b[i:i] = b[i:i + n]
    elif kind == 7:                                      # a span dropped
        del b[i:i + rng.randrange(1, 16)]
    elif kind == 8:                                      # a byte inserted
        b.insert(i, rng.randrange(256))
    else:                                                # a short span repeated (TUPLE1 after TUPLE1 ...)
        n = rng.randrange(1, 4)
        b[i:i] = b[i:i + n] * rng.choice([300, 30_000, 300_000])
    return bytes(b)


def _child_load(path: str, kind: str, out_fd: int) -> None:
    """In the forked child: load with the real loader, recording names; report as JSON."""
    from hpcml.scan.model import Verdict
    from hpcml.scan.picklewalk import map_py2
    from hpcml.scan.policy import default_policy
    policy = default_policy()
    seen: list[str] = []
    status = "ok"

    def allowed(module: str, name: str) -> bool:
        mod, nm = map_py2(module, name)
        seen.append(f"{mod}.{nm}")
        return policy.classify(mod, nm)[0] is Verdict.SAFE

    try:
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY + _mapped(), resource.RLIM_INFINITY))
        signal.alarm(int(CHILD_SECONDS))

        class Recording:
            """find_class and persistent_load of the real unpickler it is mixed into, recorded."""

            def find_class(self, module, name):
                if not allowed(module, name):
                    raise pickle.UnpicklingError("refused")
                return super().find_class(module, name)  # type: ignore[misc]

            def persistent_load(self, pid):
                seen.append("<persistent>")
                raise pickle.UnpicklingError("refused")

        unpickler = type("PickleUnpickler", (Recording, pickle.Unpickler), {})
        _LOADERS[kind](path, unpickler, Recording)
    except MemoryError:
        status = "memory"
    except BaseException as exc:  # noqa: BLE001 - a load that fails cleanly is what a loader does
        status = f"raised {type(exc).__name__}"
    os.write(out_fd, json.dumps({"status": status, "seen": seen}).encode())
    os._exit(0)


def _load_pickle(path: str, unpickler: type, recording: type) -> None:
    with open(path, "rb") as fh:
        unpickler(fh).load()


def _load_joblib(path: str, unpickler: type, recording: type) -> None:
    import joblib.numpy_pickle as jnp
    jnp.NumpyUnpickler = type("JobUnpickler", (recording, jnp.NumpyUnpickler), {})
    jnp.load(path)


def _load_torch(path: str, unpickler: type, recording: type) -> None:
    import types

    import torch
    module = types.SimpleNamespace(Unpickler=unpickler, load=lambda fh, **kw: unpickler(fh, **kw).load(),
                                   __name__="recording_pickle")
    torch.load(path, weights_only=False, pickle_module=module)


def _load_npz(path: str, unpickler: type, recording: type) -> None:
    import numpy as np
    pickle.load = lambda fh, **kw: unpickler(fh, **kw).load()   # numpy.lib.format calls pickle.load
    with np.load(path, allow_pickle=True) as npz:
        for key in npz.files:
            npz[key]


def _load_tar(path: str, unpickler: type, recording: type) -> None:
    import tarfile
    with tarfile.open(path) as tf:
        for member in tf:
            if member.isfile() and member.name.rsplit(".", 1)[-1] in ("pyd", "pickle"):
                data = tf.extractfile(member).read()          # type: ignore[union-attr]
                unpickler(io.BytesIO(data)).load()


_LOADERS = {"pickle": _load_pickle, "joblib": _load_joblib, "torch": _load_torch, "npz": _load_npz,
            "tar": _load_tar}


def _mapped() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def real_load(path: Path, kind: str) -> dict:
    """What the real load of ``path`` did, in a forked child: status (ok, raised X, memory,
    signal N, timeout) and the globals it asked for."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        faulthandler.disable()      # a mutant's SIGSEGV is a status here, not the worker's stack on stderr
        try:
            _child_load(str(path), kind, w)
        finally:
            os._exit(3)
    os.close(w)
    deadline = time.monotonic() + CHILD_SECONDS + 5
    status = None
    while time.monotonic() < deadline:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        time.sleep(0.005)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        return {"status": "timeout", "seen": []}
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return {"status": "timeout" if sig == signal.SIGALRM else f"signal {sig}", "seen": []}
    try:
        return json.loads(b"".join(chunks) or b'{"status": "no report", "seen": []}')
    except ValueError:
        return {"status": "no report", "seen": []}


def peer_seeds(root: Path, max_bytes: int = 2 << 20) -> list[Seed]:
    """Every file of other scanners' corpora under ``root`` (``../shared/testdata``, read in
    place) that is one pickle stream or a torch zip, benign and malicious alike: a mutant of
    a malicious file that the scan calls safe must not import what the original did (the
    recording unpickler refuses it, so nothing runs)."""
    import zipfile
    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.stat().st_size <= max_bytes):
        data = path.read_bytes()
        name = f"peer-{path.relative_to(root)}".replace("/", "_")
        if data[:2] == b"PK":
            try:
                members = _zip_members(data)
            except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, RuntimeError):
                continue
            if any(k.endswith("data.pkl") for k in members):
                out.append(Seed(name, "torch", members))
        elif data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
            out.append(Seed(name, "pickle", {"": data}))
    return out


def _mutated(rng: random.Random, seed_: Seed, corpus: list[Seed]) -> bytes:
    """One to three mutations: of the file's bytes, or (an archive, mostly) of one member's
    pickle, the archive then written again."""
    others = [m for s in corpus for m in s.members.values() if m]
    pickles_ = [k for k in seed_.members if k == "" or k.endswith((".pkl", ".pyd", ".pickle", ".npy"))]
    if seed_.kind in ("pickle", "joblib") or rng.random() < 0.2:
        data = build(seed_.kind, seed_.members)
        for _ in range(rng.randrange(1, 4)):
            data = mutate(rng, data, rng.choice(others))
        return data
    members = dict(seed_.members)
    key = rng.choice(pickles_)
    for _ in range(rng.randrange(1, 4)):
        members[key] = mutate(rng, members[key], rng.choice(others))
    return build(seed_.kind, members)


@dataclass
class Campaign:
    ran: int = 0
    safe: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)     # (kept file, why)
    by_kind: dict[str, list[int]] = field(default_factory=dict)      # kind: [ran, safe]

    @property
    def per_second(self) -> float:
        return self.ran / self.seconds if self.seconds else 0.0


def run(work: Path, *, seconds: float = float("inf"), inputs: int | None = None, seed: int = 62,
        keep: Path | None = None, extra: list[Seed] | None = None) -> Campaign:
    """Mutate and judge for about ``seconds``, or exactly ``inputs`` inputs (the same ones
    for one seed on every machine); failures are written to ``keep`` (else ``work``);
    ``extra``: more seeds (``peer_seeds``)."""
    from hpcml.scan.model import Verdict
    from hpcml.scan.scanner import scan_file
    rng = random.Random(seed)
    corpus = seeds() + (extra or [])
    kinds = sorted({s.kind for s in corpus})
    weights = [KIND_WEIGHT.get(k, 1) for k in kinds]
    keep = keep or work
    work.mkdir(parents=True, exist_ok=True)
    keep.mkdir(parents=True, exist_ok=True)
    c = Campaign()
    start = time.monotonic()
    while time.monotonic() - start < seconds and (inputs is None or c.ran < inputs):
        kind = rng.choices(kinds, weights)[0]
        seed_ = rng.choice([s for s in corpus if s.kind == kind])
        data = _mutated(rng, seed_, corpus)
        path = work / ("input" + seed_.suffix)
        path.write_bytes(data)
        res = scan_file(path)
        c.ran += 1
        counts = c.by_kind.setdefault(seed_.kind, [0, 0])
        counts[0] += 1
        if res.verdict is not Verdict.SAFE:
            continue
        c.safe += 1
        counts[1] += 1
        reported = {f.name for f in res.findings}
        got = real_load(path, seed_.kind)
        extra = sorted(set(got["seen"]) - reported - {"<persistent>"})
        why = None
        if got["status"] in ("timeout", "memory", "no report") or got["status"].startswith("signal"):
            why = f"the scan said safe; the real load: {got['status']}"
        elif extra:
            why = f"the scan said safe; the real load asked for {extra}"
        if why:
            kept = keep / f"fail-{c.ran:06d}-{seed_.name}{path.suffix}"
            kept.write_bytes(data)
            c.failures.append((str(kept), why))
    c.seconds = time.monotonic() - start
    return c
