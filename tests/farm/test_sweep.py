"""Sweep files and task files -> task specs (pure functions, no processes)."""

from __future__ import annotations

import pytest

from hpcml.errors import UsageError
from hpcml.farm.sweep import parse_sweep, parse_task_file


def _sweep(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return parse_sweep(p)


def test_product_zip_and_random_multiply(tmp_path):
    specs, settings = _sweep(tmp_path, """
command: train --lr {lr} --bs {bs} --seed {seed} --tag {tag} --d {dropout:.3f} --opt {opt}
product: {lr: [0.1, 0.01], bs: [32, 64, 128]}
zip: {seed: [1, 2], tag: [a, b]}
random: {samples: 3, seed: 7, params: {dropout: {uniform: [0, 0.5]}, opt: {choice: [adam, sgd]}}}
retries: 4
time_limit: 2 min
metrics_file: out/metrics.jsonl
""")
    assert len(specs) == 2 * 3 * 2 * 3
    assert settings == {"retries": 4, "time_limit": 120.0, "metrics_file": "out/metrics.jsonl"}
    first = specs[0]
    assert first.params["lr"] == 0.1 and first.params["bs"] == 32 and first.params["seed"] == 1
    assert first.params["tag"] == "a" and first.command.startswith("train --lr 0.1 --bs 32 --seed 1 --tag a --d ")
    combos = {(s.params["lr"], s.params["bs"], s.params["seed"]) for s in specs}
    assert len(combos) == 2 * 3 * 2
    assert {(s.params["seed"], s.params["tag"]) for s in specs} == {(1, "a"), (2, "b")}
    assert all(0 <= s.params["dropout"] <= 0.5 and s.params["opt"] in ("adam", "sgd") for s in specs)
    again, _ = _sweep(tmp_path, (tmp_path / "s.yaml").read_text())
    assert [s.key() for s in again] == [s.key() for s in specs]      # the seed makes it repeatable


def test_random_with_another_seed_differs_and_more_samples_extend(tmp_path):
    base = "command: t {x}\nrandom: {samples: %d, seed: %d, params: {x: {loguniform: [1.0e-5, 1.0]}}}\n"
    a, _ = _sweep(tmp_path, base % (4, 0))
    b, _ = _sweep(tmp_path, base % (4, 1))
    c, _ = _sweep(tmp_path, base % (6, 0))
    assert [s.params for s in a] != [s.params for s in b]
    assert [s.params for s in c[:4]] == [s.params for s in a]
    assert all(1e-5 <= s.params["x"] <= 1.0 for s in a + b + c)


def test_stages_with_groups_and_after(tmp_path):
    specs, _ = _sweep(tmp_path, """
tasks:
  - {group: prep, command: prep.sh}
  - {group: train, after: [prep], command: "train {lr}", product: {lr: [1, 2, 3]}}
  - {group: eval, after: [train], command: eval.sh}
""")
    assert [s.group for s in specs] == ["prep", "train", "train", "train", "eval"]
    assert specs[1].after == ("prep",) and specs[-1].after == ("train",)


README_OLD = """command: python train.py --lr {lr} --bs {bs} --seed {seed}
product: {lr: [0.1, 0.03, 0.01], bs: [64, 128]}
zip: {seed: [1, 2]}
random: {samples: 4, seed: 0, params: {wd: {loguniform: [1.0e-6, 1.0e-2]}}}
"""


@pytest.mark.parametrize("text, where, problem", [
    ("command: t {lr} {bs}\nproduct: {lr: [1]}\n", "s.yaml:1: key 'command'", "parameter 'bs'"),
    ("command: t {a}\nzip: {a: [1, 2], b: [1]}\n", "s.yaml:2: key 'zip'", "different lengths"),
    ("command: t\nprodcut: {a: [1]}\n", "s.yaml:2: key 'prodcut'", "did you mean 'product'"),
    ("command: t {x}\nrandom: {samples: 2, seed: 1, params: {x: {uniform: [0, 1], choice: [1]}}}\n",
     "key 'random.params.x'", "exactly one of"),
    ("command: t {x}\nrandom: {samples: 0, seed: 1, params: {x: {choice: [1]}}}\n", "key 'random.samples'",
     "greater than or equal to 1"),
    ("command: [t\n", "s.yaml:2", "not valid YAML"),
    ("tasks:\n  - {group: b, after: [a], command: t}\n  - {group: a, command: t}\n", "key 'tasks[0].after'",
     "waits for group 'a', which this stage or a later one defines"),
    ("tasks:\n  - {group: a, after: [a], command: t}\n", "key 'tasks[0].after'", "waits for group 'a'"),
    ("retries: -1\ncommand: t\n", "key 'retries'", "expected a count"),
    ("product: {a: [1]}\n", "key 'command'", "Field required"),
    (README_OLD, "s.yaml:4: key 'random.params.wd'", "parameter 'wd' is not used by the command"),
    ("command: t {a}\nproduct: {a: [1], b: [1, 2]}\n", "key 'product.b'", "parameter 'b' is not used"),
    ("command: t {a:.1f}\nproduct: {a: [0.11, 0.12]}\n", "key 'command'", "give the same command 't 0.1'"),
    ("command: t {a}\nproduct: {a: [x, x]}\n", "key 'command'", "it would run twice"),
    ("command: t {a}\nproduct: {a: [1]}\nraw: [b]\n", "key 'raw'", "names 'b', which is not a parameter"),
    ("command: t {repeat}\nproduct: {repeat: [1]}\nrepeat: 2\n", "key 'repeat'", "defined more than once"),
    ("command: t {repeat}\n", "key 'command'", "names parameter 'repeat', which is not defined"),
    ("command: echo `t {a}`\nproduct: {a: [1]}\n", "key 'command'", "inside backquotes"),
    ("command: t\nmetrics_file: ../m.jsonl\n", "s.yaml:2: key 'metrics_file'", "relative to each task's directory"),
    ("command: t\nmetrics_file: /tmp/m.jsonl\n", "key 'metrics_file'", "inside it"),
    ("command: t\nmetrics_file: [a]\n", "key 'metrics_file'", "found ['a']"),
])
def test_bad_sweeps_name_file_key_and_problem(tmp_path, text, where, problem):
    with pytest.raises(UsageError) as err:
        _sweep(tmp_path, text)
    msg = str(err.value)
    assert where in msg and problem in msg, msg
    assert "\n" not in msg


def test_task_file_skips_blanks_and_comments(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("# header\necho 1\n\n  echo 2  \n")
    assert [s.command for s in parse_task_file(p)] == ["echo 1", "echo 2"]
    p.write_text("# nothing\n")
    with pytest.raises(UsageError, match="no commands"):
        parse_task_file(p)



def test_a_task_file_is_not_held_to_a_config_file_s_size_limit(tmp_path):
    """A task file is generated (one line per task): 1 MiB of tasks is read; a FIFO is refused."""
    import os
    p = tmp_path / "tasks.txt"
    p.write_text("".join(f"python train.py --seed {i} --out /scratch/run-{i:06d}\n" for i in range(20_000)))
    assert p.stat().st_size > 1 << 20 and len(parse_task_file(p)) == 20_000
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UsageError, match="FIFO"):
        parse_task_file(tmp_path / "fifo")



def test_repeat_runs_copies_on_purpose_with_a_repeat_parameter(tmp_path):
    specs, _ = _sweep(tmp_path, "command: t {a}\nproduct: {a: [1, 2]}\nrepeat: 3\n")
    assert [(s.command, s.params) for s in specs[:3]] == [("t 1", {"a": 1, "repeat": i}) for i in (1, 2, 3)]
    assert len({s.key() for s in specs}) == 6           # six tasks, none deduplicated away
    seeded, _ = _sweep(tmp_path, "command: t {a} --seed {repeat}\nproduct: {a: [1]}\nrepeat: 2\n")
    assert [s.command for s in seeded] == ["t 1 --seed 1", "t 1 --seed 2"]


def test_the_readme_sweep_runs_each_command_once(tmp_path):
    from tests.farm.farmtools import ROOT
    readme = (ROOT / "README.md").read_text()
    block = readme.split("# sweep.yaml", 1)[1].split("\n", 1)[1].split("```", 1)[0]
    specs, _ = _sweep(tmp_path, block)
    assert len(specs) == 48 and len({s.command for s in specs}) == 48
