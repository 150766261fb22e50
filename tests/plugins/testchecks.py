"""Checks that exist only for the tests: they misbehave on purpose, on chosen nodes.

Loaded as protocol plugins (``type: tests.plugins.testchecks.Hang``), which also tests
the plugin path. Each one acts only on the nodes named in ``nodes`` (all when empty), so a
test can make one node of the local cluster bad.
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel, ConfigDict

from hpcml.vet.checks.base import Check, CheckReport, judge, passed


class Targeted(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[str] = []
    seconds: float = 3600.0
    value: float = 1.0
    slow_factor: float = 1.0


def _targeted(ctx, params) -> bool:
    return not params.nodes or ctx.node in params.nodes


class Spin(Check):
    """Pins itself to CPU 0 and computes until killed: with other busy processes pinned
    there, a check that gets only a share of a CPU (an oversubscribed node)."""

    type_name = "test-spin"

    def run(self) -> CheckReport:
        os.sched_setaffinity(0, {0})
        while True:
            pass


class Hang(Check):
    """Sleeps for ``seconds`` on the targeted nodes: a hung check."""

    type_name = "test-hang"
    Params = Targeted

    def run(self) -> CheckReport:
        began = time.time()
        if _targeted(self.ctx, self.params):
            time.sleep(self.params.seconds)
        return passed(0, message="did not hang", began=began, ended=time.time())


class Crash(Check):
    """Kills its own process on the targeted nodes: a check that crashes the interpreter."""

    type_name = "test-crash"
    Params = Targeted

    def run(self) -> CheckReport:
        if _targeted(self.ctx, self.params):
            os.kill(os.getpid(), 11)
        return passed(0)


class Value(Check):
    """Reports ``value`` (divided by ``slow_factor`` on the targeted nodes): a node-specific
    measurement for relative thresholds."""

    type_name = "test-value"
    Params = Targeted

    def run(self) -> CheckReport:
        v = self.params.value / (self.params.slow_factor if _targeted(self.ctx, self.params) else 1.0)
        return judge(True, v, threshold="any", unit="units")


class NotACheck:
    pass


from hpcml.vet.checks.memory import MemoryCheck  # noqa: E402 - the built-ins come after the test ones


class SlowMemory(MemoryCheck):
    """A site's subclass of an inline built-in whose own run prints and then hangs: it must
    not inherit running in the worker (no timeout there, and its print would be in the
    worker's report stream)."""

    type_name = "test-slow-memory"

    def run(self) -> CheckReport:
        print("a site check's chatter")
        time.sleep(3600)
        return super().run()


class ChattyMemory(MemoryCheck):
    """Inline by its own choice, and prints: what it prints must not reach stdout."""

    type_name = "test-chatty-memory"
    inline = True

    def run(self) -> CheckReport:
        print("a site check's chatter")
        return super().run()


class MissingModel(Check["NoSuchParams"]):
    """Names a parameters' model its params_module does not have: a protocol using it is
    bad input, one line, not a traceback."""

    type_name = "test-missing-model"

    def run(self) -> CheckReport:
        return passed(0)
