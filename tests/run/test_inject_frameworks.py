"""The frameworks users run, unchanged, under ``hpcml run``: HF transformers' ``Trainer`` on a
tiny GPT-2 built from a config and Lightning on a tiny ``LightningModule``, 2 ranks over gloo
(tests/run/scripts/). Their optimizer steps are the ranks' steps (``hpcml.observe.optimsteps``)
and DDP's all-reduce is timed (``hpcml.observe.collectives``), so one rank computing twice as
long is named a straggler about 2x live and in the report, and stuck after 45 steps of 2
micro-batches each is stopped and named; the store has those 45 steps per rank. One run per framework proves both: a framework's start-up
(~8 s of imports per rank on 2 cores) is most of a test's time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import needs
from tests.run.test_inject_progress import STUCK_AFTER, slow_then_stuck_rank_1_named, step_sections

SCRIPTS = {"transformers": "hf_trainer.py", "lightning": "lightning_ddp.py"}


@pytest.mark.machine     # a live straggler verdict: other tests' load is rightly named contention instead (scripts/test)
@pytest.mark.torch
@pytest.mark.parametrize("framework", sorted(SCRIPTS))
def test_a_slow_then_stuck_rank_of_an_unchanged_framework_script_is_named_and_its_steps_counted(tmp_path, framework):
    needs.module(framework)
    script = Path(__file__).with_name("scripts") / SCRIPTS[framework]
    slow_then_stuck_rank_1_named(tmp_path, script, ACCUM="2", OMP_NUM_THREADS="1")
    steps = list(range(1, STUCK_AFTER + 1))
    assert step_sections(tmp_path / "job") == {0: steps, 1: steps}     # optimizer steps, not micro-batches
