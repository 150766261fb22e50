"""Each farm task in its own directory (FARM/tasks/ID): a sweep of checkpointing training
tasks gives each task only its own state. Real CLI, real workers, the real Checkpointer;
what each task resumed is counted from a file it appends to (O_APPEND)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hpcml.farm.template import fill
from tests.farm.farmtools import hpcml

# a training task as a researcher writes it: a relative checkpoint directory, resume if there
TRAIN = """
import json, os, sys
from hpcml.ckpt import Checkpointer
lr, log = float(sys.argv[sys.argv.index("--lr") + 1]), os.environ["RESUMED"]
ck = Checkpointer(sys.argv[sys.argv.index("--ckpt") + 1], every=1, keep=2)
state, step = ck.load_latest()
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, (json.dumps({"task": int(os.environ["HPCML_FARM_TASK_ID"]), "lr": lr,
                          "attempt": int(os.environ["HPCML_FARM_ATTEMPT"]), "cwd": os.getcwd(),
                          "resumed_lr": None if state is None else float(state["lr"]),
                          "step": step}) + "\\n").encode())
for s in range((step or 0) + 1, (step or 0) + 3):
    ck.maybe_save(lambda: {"lr": lr, "seen": s}, s)
ck.wait()
if os.environ["HPCML_FARM_ATTEMPT"] == "1" and lr == 0.05:
    sys.exit(3)                        # fails once after saving: its retry must resume its own state
"""


def _sweep(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "sweep.yaml").write_text(f"command: {sys.executable} {{workdir}}/train.py --ckpt ckpt --lr {{lr}}"
                                         f"\nproduct: {{lr: [0.5, 0.05, 0.005]}}\nretries: 1\n{extra}")
    return tmp_path / "sweep.yaml"


def _resumed(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "resumed.jsonl").read_text().splitlines()]


def test_a_sweep_of_checkpointing_tasks_resumes_only_each_tasks_own_state(tmp_path):
    """One slot, so the tasks run one after another in the same farm run: before, task 1
    (lr 0.05) resumed task 0's checkpoint (lr 0.5). Now no first attempt resumes anything,
    the failed task's retry resumes its own, and each task's files are in FARM/tasks/ID."""
    farm = tmp_path / "farm"
    created = hpcml("farm", "create", farm, _sweep(tmp_path), cwd=tmp_path)
    assert created.returncode == 0 and "warning" not in created.stderr, created.stderr
    p = hpcml("farm", "run", farm, "--slots", "1", "--backoff", "0 s", cwd=tmp_path,
              extra={"RESUMED": str(tmp_path / "resumed.jsonl")})
    assert p.returncode == 0, p.stderr
    rows = _resumed(tmp_path)
    assert sorted((r["task"], r["attempt"]) for r in rows) == [(0, 1), (1, 1), (1, 2), (2, 1)]
    for r in rows:
        assert r["cwd"] == str(farm.absolute() / "tasks" / str(r["task"]))
        if r["attempt"] == 1:
            assert r["resumed_lr"] is None, r                                  # nobody else's state
        else:
            assert (r["resumed_lr"], r["step"]) == (r["lr"], 2), r             # its own, where it stopped
    for tid, lr in enumerate([0.5, 0.05, 0.005]):
        params = json.loads((farm / "tasks" / str(tid) / "params.json").read_text())
        assert params["params"] == {"lr": lr} and params["id"] == tid
        assert (farm / "tasks" / str(tid) / "ckpt").is_dir()
    assert not (tmp_path / "ckpt").exists()


def test_a_shared_directory_is_an_opt_out_and_another_tasks_checkpoint_is_refused(tmp_path):
    """task_dirs: false runs every task in farm run's directory, as before; the second task
    then finds the first one's checkpoint directory and is refused in one line (it would
    have resumed lr 0.5's state), and so is every later one."""
    farm = tmp_path / "farm"
    assert hpcml("farm", "create", farm, _sweep(tmp_path, "task_dirs: false\n"), cwd=tmp_path).returncode == 0
    p = hpcml("farm", "run", farm, "--slots", "1", "--retries", "0", cwd=tmp_path,
              extra={"RESUMED": str(tmp_path / "resumed.jsonl")})
    assert p.returncode == 1
    rows = _resumed(tmp_path) if (tmp_path / "resumed.jsonl").exists() else []
    assert [(r["task"], r["resumed_lr"]) for r in rows] == [(0, None)], rows
    err = (farm / "logs" / "1.1.err").read_text()
    assert "belongs to task 0 of the farm" in err and "this is task 1" in err, err
    assert (tmp_path / "ckpt").is_dir() and not (farm / "tasks" / "0" / "ckpt").exists()


def test_a_relative_path_to_a_file_here_is_a_warning_at_create(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "s.yaml").write_text("command: python train.py --lr {lr}\nproduct: {lr: [1, 2]}\n")
    p = hpcml("farm", "create", tmp_path / "farm", tmp_path / "s.yaml", cwd=tmp_path)
    assert p.returncode == 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcml farm: warning: train.py: relative to") \
        and "{workdir}/train.py" in lines[0], p.stderr
    shared = hpcml("farm", "create", tmp_path / "farm2", tmp_path / "s.yaml", "--shared-dir", cwd=tmp_path)
    assert shared.returncode == 0 and "warning" not in shared.stderr
    # issue 70: a command that first goes to the directory farm run starts in finds train.py there
    (tmp_path / "cd.yaml").write_text("command: cd {workdir} && python train.py --lr {lr}\nproduct: {lr: [1, 2]}\n")
    moved = hpcml("farm", "create", tmp_path / "farm3", tmp_path / "cd.yaml", cwd=tmp_path)
    assert moved.returncode == 0 and "warning" not in moved.stderr, moved.stderr
    (tmp_path / "back.yaml").write_text("command: cd /tmp && python train.py --lr {lr}\nproduct: {lr: [1, 2]}\n")
    elsewhere = hpcml("farm", "create", tmp_path / "farm4", tmp_path / "back.yaml", cwd=tmp_path)
    assert "warning: train.py: relative to" in elsewhere.stderr


def test_task_dir_and_workdir_are_one_word_wherever_they_stand():
    for template in ("cd {task_dir} && x --lr {lr}", "x --out '{task_dir}/o {lr}'", 'x "{workdir}/a b" {lr}'):
        cmd = fill(template, {"lr": 0.1})
        assert "$HPCML_FARM_TASK_DIR" in cmd or "$HPCML_FARM_WORKDIR" in cmd
    import subprocess
    out = subprocess.run(["/bin/sh", "-c", fill("printf '%s|' {task_dir} '{task_dir}/x y' \"{workdir}\"", {})],
                         env={"HPCML_FARM_TASK_DIR": "/f/tasks/3 a", "HPCML_FARM_WORKDIR": "/w d"},
                         capture_output=True, text=True).stdout
    assert out == "/f/tasks/3 a|/f/tasks/3 a/x y|/w d|"


def test_a_plain_command_splits_as_shlex_splits_it():
    """``relative_paths`` splits a command without the shell's quotes, escapes, comments or
    punctuation with ``str.split`` (a million tasks: shlex's character loop took most of
    ``farm create``); on 20,000 random commands, from an alphabet with every character of
    those and others, the words are shlex's wherever the fast path is taken."""
    import random
    import shlex

    from hpcml.farm.sweep import _PLAIN_COMMAND, _words
    rng = random.Random(11)
    alphabet = "ab1./-_=:{}$~*?![]^+@%, \t\n\r'\"\\;&|<>()#`\x0b\x0c\xa0é"
    fast = 0
    for _ in range(20_000):
        cmd = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        try:
            lexer = shlex.shlex(cmd, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            theirs: list[str] | None = list(lexer)
        except ValueError:
            theirs = None
        fast += bool(_PLAIN_COMMAND.fullmatch(cmd))
        assert _words(cmd) == theirs, repr(cmd)
    assert fast > 500


def test_a_word_longer_than_a_file_name_is_no_relative_path(tmp_path):
    """``relative_paths`` looks each word up as a file here: a word over 255 bytes made that
    lookup raise (ENAMETOOLONG) and ``farm create`` end with a traceback."""
    from hpcml.farm.model import TaskSpec
    from hpcml.farm.sweep import relative_paths
    (tmp_path / "train.py").write_text("")
    specs = [TaskSpec(command=f"python train.py --tag {'x' * 300}"), TaskSpec(command=f"python {'y/' * 3000}z")]
    assert relative_paths(specs, tmp_path)[0].startswith("train.py: relative to")
    tasks = tmp_path / "t.txt"
    tasks.write_text(f"echo {'x' * 300}\n")
    p = hpcml("farm", "create", tmp_path / "farm", tasks, cwd=tmp_path)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
