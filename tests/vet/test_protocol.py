from pathlib import Path

import pytest

from hpcml.errors import UsageError
from hpcml.vet.protocol import load, loads

DATA = Path(__file__).parent.parent / "fixtures"
EXAMPLES = Path(__file__).parents[2] / "examples" / "vet"


def test_cpu_example_loads_in_base_units():
    p = load(EXAMPLES / "cpu.yaml")
    by = {e.name: e for e in p.evals}
    assert p.deadline == 60.0
    assert by["tmp-disk"].params["min_free"] == 1e9
    assert by["tmp-disk"].params["write_size"] == 4 * 2**20
    assert by["memory"].params["min_available_fraction"] == pytest.approx(0.1)
    assert by["load"].severity == "warn"
    assert by["gemm"].min_relative == 0.5 and by["gemm"].scope == "node"


def test_gpu_example_loads():
    p = load(EXAMPLES / "gpu-training.yaml")
    assert p.require_gpus and any(e.scope == "allocation" for e in p.evals)


def test_vetnode_protocol_loads_unchanged():
    p = load(DATA / "vetnode" / "alps-like.yaml")
    by = {e.name: e for e in p.evals}
    assert p.vetnode and p.index_url == "https://pypi.org/simple"
    assert by["Check GPU"].type == "gpu"
    assert by["Check GPU"].params["max_temperature"] == 84  # vetnode fails at temp >= max_temp
    assert by["Check GPU"].params["max_memory_used_fraction"] == 0.2
    assert by["Cuda kernel"].type == "compute" and by["Cuda kernel"].params["device"] == "gpu"
    nccl = by["NCCL internode"]
    assert nccl.type == "collective" and nccl.scope == "allocation"
    assert nccl.params["payload"] == 8 * 2**30          # vetnode's GB is binary
    assert nccl.params["min_bandwidth"] == 15 * 2**30
    assert nccl.params["warmup"] == {"payload": 256 * 2**20, "runs": 2}
    # hpcml's equivalent needs torch, not cuda-python; the index URL given for torch is kept
    assert by["NCCL torch"].requirements == [
        ["torch", "--index-url", "https://download.pytorch.org/whl/cu130"]]
    assert nccl.requirements == [["torch"]]


def _err(text: str) -> UsageError:
    with pytest.raises(UsageError) as info:
        loads(text, "p.yaml")
    return info.value


def test_unknown_type_names_key_and_line():
    e = _err("name: x\nevals:\n  - name: a\n    type: memory\n  - name: b\n    type: nosuch\n")
    assert e.key == "evals[1].type" and e.line == 6 and "unknown check type 'nosuch'" in str(e)
    assert str(e).startswith("p.yaml:6: key 'evals[1].type':")


def test_wrong_unit_names_key_and_line():
    e = _err("name: x\nevals:\n  - name: d\n    type: disk\n    min_free: 3 parsecs\n")
    assert e.key == "evals[0].min_free" and e.line == 5 and "expected a size" in str(e)


def test_wrong_threshold_type():
    e = _err("name: x\nevals:\n  - name: c\n    type: compute\n    size: big\n")
    assert e.key == "evals[0].size" and "integer" in str(e)


def test_misspelt_key_is_rejected():
    e = _err("name: x\nevals:\n  - name: m\n    type: memory\n    min_avail: 1 GB\n")
    assert e.key == "evals[0].min_avail" and "unknown key" in str(e)


def test_nested_key_line():
    e = _err("name: x\nevals:\n  - name: c\n    type: collective\n    warmup:\n      runs: many\n")
    assert e.key == "evals[0].warmup.runs" and e.line == 6


@pytest.mark.parametrize("text,key", [
    ("name: x\n", "evals"),
    ("name: x\nevals: []\n", "evals"),
    ("evals:\n  - {name: a, type: memory}\n", "name"),
    ("name: x\nmin_nodes: 0\nevals:\n  - {name: a, type: memory}\n", "min_nodes"),
    ("name: x\nbogus: 1\nevals:\n  - {name: a, type: memory}\n", "bogus"),
    ("name: x\nevals:\n  - {name: a, type: memory}\n  - {name: a, type: load}\n", "evals[1].name"),
    ("name: x\nevals:\n  - {name: a, type: memory, severity: maybe}\n", "evals[0].severity"),
    ("name: x\nevals:\n  - {name: a, type: memory, timeout: soon}\n", "evals[0].timeout"),
    ("name: x\nevals:\n  - {name: a, type: vetnode.evaluations.random.RandomEval}\n", "evals[0].type"),
    ("name: x\nevals:\n  - {name: a, type: tests.plugins.testchecks.NotACheck}\n", "evals[0].type"),
])
def test_bad_protocols(text, key):
    assert _err(text).key == key


def test_malformed_yaml_gives_line():
    e = _err("name: x\nevals:\n  - name: a\n   type: [\n")
    assert "not valid YAML" in str(e) and e.line is not None


def test_missing_file():
    with pytest.raises(UsageError, match="file not found"):
        load("/nonexistent/protocol.yaml")


def test_plugin_type_loads():
    p = loads("name: x\nevals:\n  - {name: h, type: tests.plugins.testchecks.Hang, seconds: 1}\n")
    assert p.evals[0].check == "tests.plugins.testchecks:Hang"
    assert p.evals[0].params["seconds"] == 1.0


def test_plugin_whose_params_model_is_missing_is_one_line_on_its_type():
    e = _err("name: x\nevals:\n  - {name: m, type: tests.plugins.testchecks.MissingModel}\n")
    assert e.key == "evals[0].type" and "NoSuchParams" in str(e) and "\n" not in str(e)


def test_unset_variable_is_caught_before_the_run(tmp_path):
    """Issue 19: `vet validate` said valid, then every node failed on '${SCRATCH}'."""
    p = load(EXAMPLES / "gpu-training.yaml")
    with pytest.raises(UsageError) as exc:
        p.unset_variables({})
    msg = str(exc.value)
    assert "gpu-training.yaml" in msg and "evals.scratch.path" in msg and "$SCRATCH" in msg and "line" in msg
    p.unset_variables({"SCRATCH": "/scratch"})                      # set: fine
    load(EXAMPLES / "cpu.yaml").unset_variables({})                  # no variables: fine


def test_validate_command_refuses_an_unset_variable(tmp_path):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "SCRATCH"}
    p = subprocess.run([sys.executable, "-m", "hpcml", "vet", "validate", str(EXAMPLES / "gpu-training.yaml")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "SCRATCH" in p.stderr and p.stderr.count("\n") == 1
    p = subprocess.run([sys.executable, "-m", "hpcml", "vet", "validate", str(EXAMPLES / "gpu-training.yaml")],
                       capture_output=True, text=True, env={**env, "SCRATCH": str(tmp_path)}, timeout=60)
    assert p.returncode == 0 and "valid protocol" in p.stdout
