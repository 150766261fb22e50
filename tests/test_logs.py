"""hpcml.logs: a library message reaches the person running hpcml as a print did (the
message alone, on the stderr of the moment), and no further than hpcml's own logger."""

from __future__ import annotations

import logging
import subprocess
import sys

from hpcml import logs


def test_a_message_is_the_text_alone_on_the_current_stderr(capsys):
    log = logs.get("hpcml.run.example")
    log.info("hpcml run: done (exit 0); job directory /x")
    log.warning("hpcml ckpt: skipped /y: bad; trying the checkpoint before it")
    log.debug("not shown")
    assert capsys.readouterr().err == ("hpcml run: done (exit 0); job directory /x\n"
                                       "hpcml ckpt: skipped /y: bad; trying the checkpoint before it\n")


def test_an_applications_root_logging_does_not_see_it_twice():
    """A training script that configured logging itself gets each line once."""
    code = ("import logging; logging.basicConfig(format='ROOT %(message)s');"
            "from hpcml import logs; logs.get('hpcml.ckpt.checkpointer').warning('once')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stderr == "once\n", out.stderr


def test_the_handler_can_be_replaced(capsys):
    root = logging.getLogger(logs.ROOT)
    saved = root.handlers[:]
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    root.handlers[:] = [Keep()]
    try:
        logs.get("hpcml.x").info("elsewhere")
    finally:
        root.handlers[:] = saved
    assert seen == ["elsewhere"] and capsys.readouterr().err == ""
