"""Flight Recorder dumps written the way PyTorch's NCCL backend writes them.

The layout follows a real dump (tests/fixtures/flight_recorder/fr-nccl-1rank-torch2.11.rank_0,
recorded on an H100 with torch 2.11): top-level ``version``, ``pg_config`` (group name ->
``{"name", "desc", "ranks": "[0, 1, ...]"}``, the groups this rank belongs to), ``pg_status``
(-> ``last_enqueued/started/completed_collective``, -1 for none),
``comm_lib_version`` and ``entries`` with the same keys as the real one. pg_status and the
entries' ``pg_id`` use the rank's local id of each group, as torch does; ``Rank.status`` is
keyed by group name for the tests' convenience and translated on dump. ``only_active``
keeps pending entries only, as ``_dump_nccl_trace(onlyActive=True)`` does.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path

WORLD = 16
# 16 ranks: the default group, four tensor-parallel groups of 4, four data-parallel groups of 4
GROUPS: dict[str, tuple[str, list[int]]] = {"0": ("default_pg", list(range(WORLD)))}
for _i in range(4):
    GROUPS[str(1 + _i)] = ("tp", list(range(4 * _i, 4 * _i + 4)))
    GROUPS[str(5 + _i)] = ("dp", [_i + 4 * k for k in range(4)])

# 16 ranks of a mixture-of-experts job: the default group, four tensor-parallel groups of 4
# and two expert-parallel groups of 8 (ranks 0-7, ranks 8-15). Every rank calls new_group for
# every group, so the names (a counter) agree across ranks; a dump's pg_config holds only the
# groups its rank is a member of.
MOE_GROUPS: dict[str, tuple[str, list[int]]] = {"0": ("default_pg", list(range(WORLD)))}
for _i in range(4):
    MOE_GROUPS[str(1 + _i)] = ("tp", list(range(4 * _i, 4 * _i + 4)))
for _i in range(2):
    MOE_GROUPS[str(5 + _i)] = ("ep", list(range(8 * _i, 8 * _i + 8)))


def entry(seq: int, pg: str = "0", name: str = "nccl:all_reduce", sizes=((1048576,),), state: str = "completed",
          record_id: int = 0, dtype: str = "Float", groups: dict[str, tuple[str, list[int]]] | None = None) -> dict:
    groups = GROUPS if groups is None else groups
    desc = groups[pg][0] if pg in groups else "undefined"
    return {"record_id": record_id, "pg_id": int(pg), "process_group": (pg, desc), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": name, "time_created_ns": 1795424154178569927 + seq,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": [dtype] * len(sizes),
            "output_sizes": [list(s) for s in sizes], "output_dtypes": [dtype] * len(sizes), "state": state,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": state == "completed",
            "timeout_ms": 600000, "is_p2p": False, "thread_id": "139818381275456", "thread_name": "python3",
            "frames": [{"filename": "/opt/train.py", "line": 42, "name": "<module>"}]}


@dataclass
class Rank:
    rank: int
    status: dict[str, tuple[int, int, int]] = field(default_factory=dict)   # pg -> enqueued, started, completed
    entries: list[dict] = field(default_factory=list)
    groups: dict[str, tuple[str, list[int]]] = field(default_factory=lambda: GROUPS)

    def dump(self, only_active: bool = True) -> dict:
        """As torch writes it: pg_config and the entries' process_group by group name, but
        pg_status and the entries' pg_id by the rank's local id of the group (the groups it
        is a member of, numbered in creation order)."""
        mine = {pg: v for pg, v in self.groups.items() if self.rank in v[1]}
        local = {pg: i for i, pg in enumerate(sorted(mine, key=int))}
        entries = [{**e, "pg_id": local.get(e["process_group"][0], e["pg_id"])}
                   for e in self.entries if not only_active or e["state"] != "completed"]
        return {"version": "2.10", "comm_lib_version": "2.28.9",
                "pg_config": {pg: {"name": pg, "desc": desc, "ranks": str(ranks)} for pg, (desc, ranks) in mine.items()},
                "pg_status": {str(local[pg]): {"last_enqueued_collective": self.status.get(pg, (-1, -1, -1))[0],
                                               "last_started_collective": self.status.get(pg, (-1, -1, -1))[1],
                                               "last_completed_collective": self.status.get(pg, (-1, -1, -1))[2]}
                              for pg in mine},
                "entries": entries}


def job(level: dict[str, int] | None = None, groups: dict[str, tuple[str, list[int]]] | None = None) -> dict[int, Rank]:
    """Every rank having completed collective ``level[pg]`` in each of its groups."""
    level = level or {}
    groups = GROUPS if groups is None else groups
    ranks = {r: Rank(r, groups=groups) for r in range(WORLD)}
    for pg, (_, members) in groups.items():
        n = level.get(pg, 100 + int(pg))
        for r in members:
            ranks[r].status[pg] = (n, n, n)
    return ranks


def write(directory: Path, ranks: dict[int, Rank], only_active: bool = True, skip: tuple[int, ...] = (),
          prefix: str = "nccl_trace_dump_") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for r, rank in ranks.items():
        if r not in skip:
            (directory / f"{prefix}{r}").write_bytes(pickle.dumps(rank.dump(only_active)))
    return directory


def lock_gil(stuck: tuple[int, ...] = (9, 14), level: int = 45264, ep_level: int = 9120,
             timing: bool = True) -> dict[int, Rank]:
    """NVRx's "lock_gil" fault on a mixture-of-experts job (MOE_GROUPS): the ``stuck`` ranks
    hold the GIL before the expert-parallel all_to_all of group "6" (ranks 8-15), so they
    never enqueue it and their pending-only dumps are empty. The others of 8-15 wait inside
    it; ranks 0-7 finished theirs (group "5") and wait in the next world all_reduce, so on the
    default group ranks 8-15 all look behind. ``timing=False``: pg_status tracks enqueued
    only (-1 for started and completed) and pending entries stay "scheduled", as torch
    writes them without TORCH_NCCL_ENABLE_TIMING."""
    ranks = job({"0": level, "5": ep_level + 1, "6": ep_level}, groups=MOE_GROUPS)

    def status(enqueued: int, started: int, completed: int) -> tuple[int, int, int]:
        return (enqueued, started, completed) if timing else (enqueued, -1, -1)

    for r, rank in ranks.items():
        for pg, (e, s, c) in list(rank.status.items()):
            rank.status[pg] = status(e, s, c)
        if r < 8:
            rank.status["0"] = status(level + 1, level + 1, level)
            rank.entries = [entry(level + 1, pg="0", state="started" if timing else "scheduled", groups=MOE_GROUPS,
                                  record_id=7)]
        elif r not in stuck:
            rank.status["6"] = status(ep_level + 1, ep_level + 1, ep_level)
            rank.entries = [entry(ep_level + 1, pg="6", name="nccl:all_to_all", sizes=((1000 + 37 * r, 4096),),
                                  dtype="BFloat16", state="started" if timing else "scheduled", groups=MOE_GROUPS,
                                  record_id=7)]
    return ranks
