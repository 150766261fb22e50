"""The loader's cores: when a rank's data-loader workers wait for a CPU instead of loading.

``srun`` without ``--cpus-per-task`` gives each task one core, and every DataLoader worker
the rank starts then shares it with the rank itself (a Frontier user's WebDataset reading
at 0.19 batches/s against 2.47 elsewhere: pytorch-caney #44). The host sampler counts a
rank's worker processes, their CPU use and the cores the rank may run on
(``hpcml.samplers.host``); one rule, here, says when that is short, for the live watch
(``hpcml.run.watch``: said once while the job runs) and the report (a finding) alike.
"""

from __future__ import annotations

from dataclasses import dataclass

BUSY_SHARE = 0.5           # of a rank's cores its workers must use for the cores to be short


def short(workers: int, cores: float | None, workers_cpu_percent: float | None) -> bool:
    """Outnumbered and busy: the workers and the rank are more processes than the cores they
    may use, and the workers used at least half of those cores (idle workers wait for
    nothing: a loader that keeps up needs no more cores)."""
    return (workers >= 1 and cores is not None and cores > 0 and workers + 1 > cores
            and (workers_cpu_percent or 0.0) >= BUSY_SHARE * 100 * cores)


@dataclass(frozen=True)
class Short:
    """One rank short of cores, said with its fix."""

    rank: int
    node: str
    workers: int
    cores: float
    workers_cpu_percent: float

    def what(self, others: int = 0) -> str:
        more = f" (and {others} more ranks)" if others else ""
        cores = f"{self.cores:g} core" + ("s" if self.cores != 1 else "")
        return (f"rank {self.rank} on {self.node}{more}: its {self.workers} worker processes (DataLoader workers) "
                f"and the rank itself shared {cores}, the workers busy {self.workers_cpu_percent:.0f}% of a core: "
                "they wait for a CPU instead of loading")

    def fix(self) -> str:
        need = self.workers + 1
        quota = "" if float(self.cores).is_integer() else " (a cgroup CPU quota: raise cpu.max, or the job's CPU limit)"
        return (f"give each task {need} cores{quota}: #SBATCH --cpus-per-task={need} (srun gives a task one core "
                f"without it), or DataLoader(num_workers={max(0, int(self.cores) - 1)})")

    def ratio(self) -> float:
        return (self.workers + 1) / max(self.cores, 0.01)
