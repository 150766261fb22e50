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
                                        ({"max_restarts": 1, "spare_nodes": 2}, "spare_nodes")])
def test_bad_input_names_its_option(change, key):
    with pytest.raises(UsageError) as err:
        Config.of(Options(**{"cmd": ["true"], **change}), nodes=2)
    assert err.value.key == key
