"""Loaded by every Python process of an ``hpcml run`` rank (PYTHONPATH): dump PyTorch's
Flight Recorder when the watch asks, without a change to the training script.

Why here: a rank stuck in a collective has its main thread blocked in C++ (a Python signal
handler would never run), but torch's collectives release the GIL while they wait, so a
thread of the rank can still call ``torch._C._distributed_c10d._dump_fr_trace()`` (gloo and
NCCL alike, torch >= 2.5; ``_dump_nccl_trace``, NCCL only, before; the recorder itself is
armed by ``TORCH_FR_BUFFER_SIZE``, ``TORCH_NCCL_TRACE_BUFFER_SIZE`` before 2.5, which
``hpcml run`` sets). The thread looks for the watch's snapshot request once a second (one
``stat``) and writes ``<observe>/flight-recorder/rank-NNNNN``. It never imports torch: a
process that did not initialise ``torch.distributed`` has nothing to dump. A rank whose GIL
is held (a C call that does not release it) cannot dump; py-spy's stack still locates it.

The site's own ``sitecustomize``, if any, is loaded first, as ddtrace-run's bootstrap does.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
import time

ENV = "HPCML_RUN_SNAPSHOT_DIR"      # the attempt's observe store
# The request file and the dump directory are hpcml.observe.snapshot's REQUEST (under the
# store's beat/) and FLIGHT_RECORDER, written out here: this file runs in every Python
# process of a rank and imports nothing of hpcml.
POLL = 1.0


def _chain() -> None:
    here = os.path.realpath(__file__)
    others = [p for p in sys.path if os.path.realpath(os.path.join(p or ".", "sitecustomize.py")) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None or os.path.realpath(spec.origin or "") == here:
        return                                        # none, or this file again under another name
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the site's own file failing is its business, as without us
        print(f"hpcml run: the site's sitecustomize failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    sys.modules["sitecustomize"] = module          # `import sitecustomize` finds the site's, as without us


def _dump(observe: str, ident: int) -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    import torch
    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, "_dump_fr_trace", None)      # torch >= 2.5: every backend
    if dump is None:                                  # before: the NCCL backend's own, NCCL only
        dump = getattr(c10d, "_dump_nccl_trace", None)
    if dump is None:
        return
    data = dump(True, False, False)
    rank = dist.get_rank()
    out = os.path.join(observe, "flight-recorder")
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, f".rank-{rank:05d}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(out, f"rank-{rank:05d}"))


def _watch(observe: str) -> None:
    request = os.path.join(observe, "beat", "snapshot.json")
    seen = None
    while True:
        time.sleep(POLL)
        try:
            mtime = os.stat(request).st_mtime
            if mtime == seen:
                continue
            seen = mtime
            with open(request, "rb") as f:
                ident = int(json.loads(f.read(4096))["id"])
            _dump(observe, ident)
        except Exception:  # noqa: BLE001, S112 - never into the training loop: the stack still names the rank
            continue


if __name__ == "sitecustomize":
    _chain()
    if os.environ.get(ENV):
        threading.Thread(target=_watch, args=(os.environ[ENV],), name="hpcml-flight-recorder", daemon=True).start()
