"""Every optimizer step a step (``hpcml.observe.optimsteps``): the rules on real torch
optimizers through torch's real global hooks, in this process; the API's side
(``optimizer_step``, ``own_steps``) through a real store. A whole ``hpcml run`` of an
unchanged DDP script: tests/run/test_inject_progress.py."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest

from hpcml.observe.store import read_job
from tests import needs

torch = needs.module("torch")

from hpcml.observe import optimsteps  # noqa: E402


class Seen:
    """Stands in for the API: what was recorded, and whether the program logs its own."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, float, int]] = []
        self.own = False
        self.started = 0

    def record(self, step: int, seconds: float, end_ns: int) -> bool:
        if self.own:
            return False
        self.steps.append((step, seconds, end_ns))
        return True

    def numbers(self) -> list[int]:
        return [s for s, _, _ in self.steps]


@pytest.fixture
def hooked():
    seen = Seen()
    steps = optimsteps.Steps(seen.record, lambda: seen.own, lambda: setattr(seen, "started", seen.started + 1))
    optimsteps.install(steps)
    yield steps, seen
    steps._stop()
    for h in steps.handles:
        h.remove()


def sgd(lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=lr)


def test_one_step_call_is_one_step_and_step_1_waits_for_step_2(hooked):
    steps, seen = hooked
    opt = sgd()
    opt.step()
    assert seen.steps == [] and steps.held is not None and seen.started == 1     # held: does it log its own?
    for _ in range(3):
        opt.step()
    assert seen.numbers() == [1, 2, 3, 4]
    ends = [e for _, _, e in seen.steps]
    assert ends == sorted(ends) and all(s >= 0 for _, s, _ in seen.steps)


def test_a_step_lasts_from_the_end_of_the_one_before(hooked):
    steps, seen = hooked
    opt = sgd()
    opt.step()
    opt.step()
    before = seen.steps[-1][2]
    x = torch.randn(300, 300)
    for _ in range(20):                                   # the loop's work between two step() calls
        x = x @ x / 300
    opt.step()
    step, seconds, end = seen.steps[-1]
    assert step == 3 and seconds * 1e9 >= (end - before) * 0.5       # the iteration, not step() alone


def test_two_optimizers_stepping_each_iteration_count_once_per_iteration(hooked):
    """A GAN: the first to step is counted; the other, stepping between, never takes over."""
    _, seen = hooked
    d, g = sgd(), sgd()
    for _ in range(5):
        for _ in range(3):                                # a critic's several steps per generator step
            d.step()
        g.step()
    assert seen.numbers() == list(range(1, 16))           # d's 15 steps, g's none
    seen.steps.clear()
    for _ in range(3):
        g.step()
        d.step()
    assert seen.numbers() == [16, 17, 18]                 # 1:1, either order: d's
    seen.steps.clear()
    g2, d2 = sgd(), sgd()                                  # a new pair, d still referenced
    for _ in range(4):
        g2.step()
        d2.step()
    assert seen.numbers() == [19, 20, 21]                 # the first to step twice took over: steps go on


def test_an_optimizer_that_replaces_the_first_takes_over_and_steps_never_stop(hooked):
    _, seen = hooked
    first, second = sgd(), sgd()
    for _ in range(3):
        first.step()
    for _ in range(4):                                    # first still referenced, no longer stepped
        second.step()
    assert seen.numbers() == [1, 2, 3, 4, 5, 6]           # second's first step is not counted: a GAN's would not be
    del first, second
    gc.collect()
    third = sgd()
    third.step()
    third.step()
    assert seen.numbers()[-2:] == [7, 8]                   # the counted one is gone: the next counts at once


def test_a_step_inside_another_is_part_of_it(hooked):
    _, seen = hooked

    class Wrapping(torch.optim.SGD):                       # ZeroRedundancyOptimizer's shape: an inner optimizer
        def __init__(self) -> None:
            super().__init__([torch.zeros(1, requires_grad=True)], lr=0.1)
            self.inner = sgd()

        def step(self, closure=None):
            return self.inner.step()

    class Derived(torch.optim.SGD):                        # a subclass calling the (hooked) base step
        def step(self, closure=None):
            return super().step(closure)

    base = sgd()
    base.step()
    base.step()                                            # SGD.step hooked: Derived's base step is too
    del base
    gc.collect()
    n = len(seen.steps)
    w = Wrapping()
    for _ in range(3):
        w.step()
    assert len(seen.steps) == n + 3
    del w
    gc.collect()
    d = Derived([torch.zeros(1, requires_grad=True)], lr=0.1)
    for _ in range(3):
        d.step()
    assert len(seen.steps) == n + 6


def test_a_step_that_raised_does_not_silence_the_next(hooked):
    _, seen = hooked

    class Failing(torch.optim.SGD):
        fail = True

        def step(self, closure=None):
            if self.fail:
                raise RuntimeError("out of memory")       # a post hook that never comes
            return super().step(closure)

    opt = Failing([torch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(RuntimeError):
        opt.step()
    opt.fail = False
    for _ in range(3):
        opt.step()
    assert seen.numbers() == [1, 2, 3]


def test_a_program_that_logs_its_own_steps_gets_none_of_ours(hooked):
    steps, seen = hooked
    opt = sgd()
    opt.step()
    seen.own = True                                        # it logged after its first iteration
    opt.step()
    opt.step()
    assert seen.steps == [] and steps.off
    steps._exit()
    assert seen.steps == []


def test_one_that_starts_logging_later_stops_ours_then(hooked):
    steps, seen = hooked
    opt = sgd()
    for _ in range(3):
        opt.step()
    seen.own = True
    opt.step()
    assert seen.numbers() == [1, 2, 3] and steps.off


def test_step_1_of_a_program_that_ends_after_it_is_recorded_at_exit(hooked):
    steps, seen = hooked
    sgd().step()
    steps._exit()
    assert seen.numbers() == [1]


def test_a_forked_child_counts_nothing(hooked):
    steps, seen = hooked
    opt = sgd()
    opt.step()
    opt.step()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                           # a DataLoader worker: forked with the hooks in place
        opt.step()
        os.write(w, f"{steps.off} {len(seen.steps)}".encode())
        os._exit(0)
    os.close(w)
    assert os.read(r, 100).decode() == "True 2"
    os.waitpid(pid, 0)
    os.close(r)
    opt.step()
    assert seen.numbers() == [1, 2, 3]


def test_the_api_records_optimizer_steps_as_step_sections_until_the_program_logs_its_own(tmp_path):
    code = """
        from hpcml.observe import api
        import time
        assert not api.own_steps()
        for n in (1, 2, 3):
            assert api.optimizer_step(n, 0.5, time.time_ns())
        with api.section("dataload"):                # no step number: labelled with ours, still ours
            pass
        assert not api.own_steps()
        api.log(step=7, loss=1.0)                    # its own from now on
        assert api.own_steps() and not api.optimizer_step(4, 0.5, time.time_ns())
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "HPCML_OBSERVE_DIR": str(tmp_path), "SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert p.returncode == 0, p.stderr
    t = read_job(tmp_path).table.to_pydict()
    rows = [(k, n, v, s) for k, n, v, s in zip(t["kind"], t["name"], t["value"], t["step"]) if k != "problem"]
    assert rows == [("section", "step", 0.5, 1), ("section", "step", 0.5, 2), ("section", "step", 0.5, 3),
                    ("section", "dataload", rows[3][2], 3), ("metric", "loss", 1.0, 7)]


def test_a_step_section_without_a_number_is_the_programs_own(tmp_path):
    code = """
        from hpcml.observe import api
        with api.section("step"):
            pass
        assert api.own_steps()
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "HPCML_OBSERVE_DIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
