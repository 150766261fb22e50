"""GPU health from one NVML snapshot: count, lost GPUs, ECC, row remapping, retired pages,
throttling, PCIe link, temperature, memory and leftover processes.

Why these: the vetting note ranks GPU count / NVML answering, ECC and row remapping, PCIe
downgrades and hygiene (leftover processes, used memory) as the cheapest checks that catch
most failed GPUs. All of them come from one NVML read, so this is one check with one
verdict per node, and a message that names every bad GPU and why.

The snapshot comes through :meth:`GpuCheck.snapshot`. Setting the environment variable
``HPCML_VET_NVML_REPLAY=/path/snapshot.json`` makes it replay a snapshot recorded with
``python -m hpcml.vet.checks.nvml_snapshot`` instead of reading NVML; tests use this, and so
can anyone re-judging a node's recorded state with other thresholds.

No GPU (no driver, no NVML GPUs) is SKIPPED unless ``required`` or ``ctx.require_gpus``:
then it FAILS. A GPU in ``ctx.gpus`` that NVML does not show FAILS whenever a driver is
loaded. A node with no driver (no ``/proc/driver/nvidia``, no ``/dev/nvidiactl``) has no GPU
even when libnvidia-ml or pynvml is missing; with a driver, a missing NVML raises
MissingDependency (an ``error``). PCIe generation is not judged while
the GPU reports ``gpu_idle``: NVIDIA GPUs lower the link generation when idle to save
power (the width stays), so an idle healthy GPU would otherwise fail.

A limit whose value NVML did not give (``None``: not supported on this GPU) is not judged,
and the message names it ("not measured: ..."): no GPU is called healthy on a figure nobody
read. The pending-retirement and row-remapping flags are left out of that list: each GPU
generation has one of the two mechanisms, and the other is not applicable rather than unknown.
"""

from __future__ import annotations

import os
import re

from pydantic import BaseModel, ConfigDict, field_validator

from hpcml import unit_fields, units
from hpcml.samplers.clockreasons import CLOCK_REASONS, reason_names
from hpcml.vet.checks.base import Check, MissingDependency
from hpcml.vet.checks.nvml_snapshot import (
    GpuInfo,
    GpuSnapshot,
    driver_present,
    load_snapshot,
    read_gpus,
    select,
)
from hpcml.vet.model import CheckReport, Json, Outcome

REPLAY_ENV = "HPCML_VET_NVML_REPLAY"


def _reason(name: str) -> str:
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip()).lower()
    snake = re.sub(r"[\s-]+", "_", snake)
    if snake not in CLOCK_REASONS:
        raise ValueError(f"unknown throttle reason {name!r}; expected one of "
                         + ", ".join(CLOCK_REASONS))
    return snake


class GpuParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: int | None = None
    max_temperature: float | None = None
    max_memory_used: unit_fields.Bytes | None = None
    max_memory_used_fraction: unit_fields.Fraction | None = None
    max_ecc_uncorrected: int | None = 0          # volatile count (since driver load)
    max_retired_pages: int | None = None
    fail_on_retired_pages_pending: bool = True
    fail_on_row_remap_pending: bool = True
    fail_on_row_remap_failure: bool = True
    throttle_fail: list[str] = ["hw_slowdown", "hw_thermal_slowdown",
                                "hw_power_brake_slowdown", "sw_thermal_slowdown"]
    throttle_warn: list[str] = ["sw_power_cap"]
    pcie_min_gen: int | None = None              # None: the link's own max
    pcie_min_width: int | None = None
    pcie_gen_when_idle: bool = False
    max_foreign_processes: int | None = 0
    required: bool = False

    @field_validator("throttle_fail", "throttle_warn")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        return [_reason(n) for n in v]


def _gb(n: float) -> str:
    return units.fmt_bytes(n)


class GpuCheck(Check[GpuParams]):
    """Judges every GPU of the task (``ctx.gpus``) or of the node in one NVML snapshot."""

    def snapshot(self) -> tuple[GpuSnapshot, str, list[str]]:
        """The task's GPUs to judge, where they came from (the seam for replay), and the
        task's GPUs none matched."""
        ids = list(self.ctx.gpus) or None
        path = os.environ.get(REPLAY_ENV)
        if path:
            snap, missing = select(load_snapshot(path), ids)
            return snap, f"replay:{path}", missing
        try:
            snap, missing = read_gpus(ids)
            return snap, "nvml", missing
        except MissingDependency as e:
            if driver_present():               # a driver is loaded: NVML must be found
                raise
            return GpuSnapshot(False, errors=[str(e)]), "nvml", []

    def run(self) -> CheckReport:
        p = self.params
        required = p.required or self.ctx.require_gpus
        snap, source, missing = self.snapshot()
        details: dict[str, Json] = {"source": source, "driver_version": snap.driver_version,
                                    "errors": snap.errors, "hidden": snap.hidden}
        if not snap.driver_loaded or (not snap.gpus and not snap.errors and not missing):
            why = "NVIDIA driver not loaded" if not snap.driver_loaded else "NVML sees none"
            if required:
                return CheckReport(Outcome.FAIL, 0, "GPUs present", "GPUs",
                                   f"no GPU: {why}", details)
            return CheckReport(Outcome.SKIPPED, message=f"no GPU ({why})", details=details)

        fails: list[str] = [f"nvml: {e}" for e in snap.errors]
        warns: list[str] = []
        expected = p.count if p.count is not None else (len(self.ctx.gpus) or None)
        fails += [f"GPU {m} not found" for m in missing]
        if expected is not None and not missing and len(snap.gpus) != expected:
            (fails if len(snap.gpus) < expected else warns).append(
                f"{len(snap.gpus)} GPUs found, {expected} expected")
        bad = len(missing) + (max(0, expected - len(snap.gpus)) if expected and not missing
                              else 0)
        per_gpu = []
        unread: dict[str, list[str]] = {}          # limit -> GPUs it could not be judged on
        for g in snap.gpus:
            gf, gw = self._judge(g, p)
            bad += bool(gf)
            label = f"gpu{g.index}"
            fails += [f"{label}: " + ", ".join(gf)] if gf else []
            warns += [f"{label}: " + ", ".join(gw) + " (warn)"] if gw else []
            gone = [] if g.lost else _not_measured(g, p)
            for what in gone:
                unread.setdefault(what, []).append(label)
            per_gpu.append({**_summary(g), "problems": gf, "warnings": gw, "not_measured": gone})
        details["gpus"] = per_gpu
        outcome = Outcome.FAIL if fails else Outcome.WARN if warns else Outcome.PASS
        gaps = "not measured: " + "; ".join(f"{what} ({', '.join(gpus)})" for what, gpus in unread.items())
        if fails or warns:
            message = "; ".join(fails + warns + ([gaps] if unread else []))
        elif unread:
            message = f"{len(snap.gpus)} GPUs: no problem in what was read; {gaps}"
        else:
            message = f"{len(snap.gpus)} GPUs healthy"
        return CheckReport(outcome, bad, "0 bad GPUs", "GPUs", message, details)

    @staticmethod
    def _judge(g: GpuInfo, p: GpuParams) -> tuple[list[str], list[str]]:
        """The failing and warning problems of one GPU, in words."""
        if g.lost:
            return [f"lost ({g.error})"], []
        f: list[str] = []
        w = [f"could not read {k} ({v})" for k, v in g.field_errors.items()]
        if p.max_temperature is not None and g.temperature is not None \
                and g.temperature > p.max_temperature:
            f.append(f"temperature {g.temperature} C > {p.max_temperature:g} C")
        if g.memory_used is not None:
            if p.max_memory_used is not None and g.memory_used > p.max_memory_used:
                f.append(f"memory used {_gb(g.memory_used)} > {_gb(p.max_memory_used)}")
            if p.max_memory_used_fraction is not None and g.memory_total:
                frac = g.memory_used / g.memory_total
                if frac > p.max_memory_used_fraction:
                    f.append(f"memory used {frac:.1%} > {p.max_memory_used_fraction:.1%}")
        if p.max_ecc_uncorrected is not None and g.ecc_volatile_uncorrected is not None \
                and g.ecc_volatile_uncorrected > p.max_ecc_uncorrected:
            f.append(f"{g.ecc_volatile_uncorrected} uncorrected ECC errors "
                     f"> {p.max_ecc_uncorrected}")
        if p.fail_on_row_remap_failure and g.remap_failure:
            f.append("row remapping failed (replace the GPU)")
        if p.fail_on_row_remap_pending and g.remap_pending:
            f.append("row remapping pending (reset the GPU)")
        if p.fail_on_retired_pages_pending and g.retired_pages_pending:
            f.append("page retirement pending (reset the GPU)")
        retired = _retired(g)              # at least: a part not read is not counted as 0 pages
        if p.max_retired_pages is not None and retired > p.max_retired_pages:
            f.append(f"{retired} retired pages > {p.max_retired_pages}")
        reasons = reason_names(g.clocks_event_reasons)
        if hits := [r for r in reasons if r in p.throttle_fail]:
            f.append("clocks throttled: " + ", ".join(hits))
        if hits := [r for r in reasons if r in p.throttle_warn and r not in p.throttle_fail]:
            w.append("clocks throttled: " + ", ".join(hits))
        if link := _pcie_problem(g, p, idle="gpu_idle" in reasons):
            f.append(link)
        if p.max_foreign_processes is not None and g.processes is not None:
            foreign = [q for q in g.processes if q.pid != os.getpid()]
            if len(foreign) > p.max_foreign_processes:
                f.append(f"{len(foreign)} leftover process(es) (" + ", ".join(
                    f"pid {q.pid}" + (f" using {_gb(q.used_memory)}" if q.used_memory
                                      else "") for q in foreign) + ")")
        return f, w


def _retired(g: GpuInfo) -> int:
    """Retired pages read (single- and double-bit causes); those not read are not in it."""
    return sum(n for n in (g.retired_pages_sbe, g.retired_pages_dbe) if n is not None)


def _not_measured(g: GpuInfo, p: GpuParams) -> list[str]:
    """The limits set for ``g`` that NVML gave no value to judge. A field that failed to read
    is already a warning of its own (``field_errors``), so it is not named twice."""
    read_failed = set(g.field_errors)
    retired = (g.retired_pages_sbe, g.retired_pages_dbe)
    limits = (     # (what, limit set, value missing, the fields NVML reads it from)
        ("temperature", p.max_temperature is not None, g.temperature is None, {"temperature"}),
        ("memory used", p.max_memory_used is not None or p.max_memory_used_fraction is not None,
         g.memory_used is None or (p.max_memory_used_fraction is not None and not g.memory_total), {"memory"}),
        ("uncorrected ECC errors", p.max_ecc_uncorrected is not None, g.ecc_volatile_uncorrected is None,
         {"ecc_volatile_uncorrected"}),
        ("retired pages", p.max_retired_pages is not None,      # those read already too many: judged (failed)
         None in retired and not (p.max_retired_pages is not None and _retired(g) > p.max_retired_pages),
         {"retired_pages_sbe", "retired_pages_dbe"}),
        ("clocks event reasons", bool(p.throttle_fail or p.throttle_warn), g.clocks_event_reasons is None,
         {"clocks_event_reasons"}),
        ("PCIe link", True, g.pcie_gen is None or g.pcie_width is None, {"pcie_gen", "pcie_width"}),
        ("processes", p.max_foreign_processes is not None, g.processes is None, {"processes"}),
    )
    return [what for what, wanted, missing, fields in limits if wanted and missing and not fields & read_failed]


def _pcie_problem(g: GpuInfo, p: GpuParams, idle: bool) -> str | None:
    if g.pcie_gen is None or g.pcie_width is None:
        return None
    min_gen = p.pcie_min_gen if p.pcie_min_gen is not None else g.pcie_gen_max
    min_width = p.pcie_min_width if p.pcie_min_width is not None else g.pcie_width_max
    gen_low = min_gen is not None and g.pcie_gen < min_gen and (p.pcie_gen_when_idle
                                                                 or not idle)
    width_low = min_width is not None and g.pcie_width < min_width
    if not (gen_low or width_low):
        return None
    label = "max" if p.pcie_min_gen is None and p.pcie_min_width is None else "min"
    return (f"PCIe gen{g.pcie_gen} x{g.pcie_width} < {label} "
            f"gen{min_gen if min_gen is not None else '?'} "
            f"x{min_width if min_width is not None else '?'}")


def _summary(g: GpuInfo) -> dict:
    keys = ("index", "minor", "uuid", "name", "pci_bus_id", "lost", "error", "temperature",
            "memory_used", "memory_total", "ecc_volatile_uncorrected",
            "ecc_aggregate_uncorrected", "remap_pending", "remap_failure",
            "retired_pages_pending", "power_mw", "sm_clock_mhz", "pcie_gen",
            "pcie_gen_max", "pcie_width", "pcie_width_max")
    d = {k: getattr(g, k) for k in keys}
    d["clocks_event_reasons"] = reason_names(g.clocks_event_reasons)
    d["processes"] = None if g.processes is None else [vars(q) for q in g.processes]
    d["unsupported"] = g.unsupported
    return d
