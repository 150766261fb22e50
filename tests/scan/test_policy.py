"""The built-in policy file is read without PyYAML (start-up): what that reader takes
must be exactly what YAML says the file holds, and it refuses any other shape."""

from __future__ import annotations

import importlib.resources

import pytest
import yaml

from hpcml.scan.policy import builtin_lists, default_policy, not_advised


def test_the_builtin_reader_agrees_with_yaml_on_the_shipped_file():
    text = importlib.resources.files("hpcml.scan.policy").joinpath("default.yaml").read_text()
    assert builtin_lists(text) == yaml.safe_load(text)
    assert "os.*" in builtin_lists(text)["dangerous"] and default_policy().block_unknown is True


@pytest.mark.parametrize("text", ["safe:\n  - a.b\nnested:\n  inner: 1\n", "block_unknown: maybe\n",
                                  "safe: [a.b]\n", "  - orphan.item\n"])
def test_the_builtin_reader_refuses_what_it_does_not_know(text):
    with pytest.raises(ValueError):
        builtin_lists(text)


def test_not_advised_names():
    assert not_advised("mypkg.models.Net") is None and not_advised("__main__.Net") is None
    assert "private" in not_advised("mypkg._impl.helper")
    assert "private" in not_advised("_pyrepl.pager.pipe_pager")
    assert "standard-library" in not_advised("imaplib.IMAP4")
    assert "private" in not_advised("mypkg.Net.__reduce__")
