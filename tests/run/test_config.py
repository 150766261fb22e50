"""``hpcml run``'s options checked once into a frozen Config: nothing they name is changed
on the way (the options, the launcher's environment), and bad input names its option."""

from __future__ import annotations

import dataclasses
import os

import pytest

from hpcml.errors import UsageError
from hpcml.run.config import Config, Options


def test_the_config_is_frozen_and_the_options_and_environment_untouched(monkeypatch):
    pytest.importorskip("cramjam", reason="the remote extra is part of the test extra")
    monkeypatch.delenv("HPCML_COLLECTOR", raising=False)
    before = dict(os.environ)
    opts = Options(cmd=["true"], remote_write="http://127.0.0.1:9/api/v1/write", collector="http://127.0.0.1:8/",
                   hang_timeout="90s")
    cfg = Config.of(opts, nodes=2)
    assert dict(os.environ) == before                          # the ranks get it through cfg.rank_env
    assert list(cfg.rank_env.values()) == ["http://127.0.0.1:9/api/v1/write"]
    assert cfg.collector == "http://127.0.0.1:8" and opts.collector == "http://127.0.0.1:8/"
    assert cfg.hang_s == 90.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.ntasks = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.rank_env["X"] = "y"  # type: ignore[index]


@pytest.mark.parametrize("change,key", [({"cmd": []}, "cmd"), ({"min_nodes": 3}, "min_nodes"),
                                        ({"ntasks": 0}, "ntasks"), ({"hang_timeout": "soon"}, "hang_timeout"),
                                        ({"spare_nodes": 1}, "spare_nodes"), ({"on_hang": "pray"}, "on_hang"),
                                        ({"max_restarts": 1, "spare_nodes": 2}, "spare_nodes"),
                                        ({"step_pattern": "iter (\\d+"}, "step_pattern"),
                                        ({"step_pattern": "iter \\d+"}, "step_pattern"),
                                        ({"step_pattern": "(iter) (\\d+)"}, "step_pattern")])
def test_bad_input_names_its_option(change, key):
    with pytest.raises(UsageError) as err:
        Config.of(Options(**{"cmd": ["true"], **change}), nodes=2)
    assert err.value.key == key


@pytest.mark.parametrize("nodes,local,more,ok", [
    (1, True, {}, False),                              # local tasks: one node
    (4, True, {"spare_nodes": 1}, False),
    (2, False, {}, False),                             # every node runs, no spare: none to leave out
    (2, False, {"min_nodes": 2}, False),
    (1, False, {}, False),
    (2, False, {"min_nodes": 1}, True),
    (2, False, {"spare_nodes": 1}, True),
])
def test_on_straggler_restart_needs_a_node_to_leave_out(nodes, local, more, ok):
    opts = Options(cmd=["true"], max_restarts=1, on_straggler="restart", **more)
    if ok:
        assert Config.of(opts, nodes=nodes, local=local).on_straggler == "restart"
        return
    with pytest.raises(UsageError, match="restart needs a node to leave the straggler's out") as err:
        Config.of(opts, nodes=nodes, local=local)
    assert err.value.key == "on_straggler"
    assert Config.of(dataclasses.replace(opts, on_straggler="report"), nodes=nodes, local=local)   # report is fine
