"""The README's exit-code table is true: each documented code, produced by a real command.

Probes run the commands as a user would (outside Slurm); the table is read from the README
itself, so a code the table does not list, or a code that moved, fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def table() -> dict[int, str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| (.+) \|$", section, re.M)}


def hpcml(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run([sys.executable, "-m", "hpcml", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=180)


def test_the_table_lists_every_code():
    assert sorted(table()) == [0, 1, 2, 3, 4, 5, 6, 7, 8]


PROBES = [
    # (what, code, words the table's line for that code must contain, files, argv)
    ("scan of a path that does not exist", 2, "bad input", {}, ["scan", "nope.pt"]),
    ("vet with a protocol that does not validate", 2, "bad input",
     {"p.yaml": "name: x\nevals:\n  - {name: d, type: disk, min_free: lots}\n"}, ["vet", "run", "p.yaml", "--local"]),
    ("env run with an EDF that does not exist", 2, "bad input", {}, ["env", "run", "./none.toml", "--", "true"]),
    ("observe report of something that is not a job directory", 2, "bad input", {}, ["observe", "report", "."]),
    ("vet abort", 4, "abort",
     {"p.yaml": "name: x\nevals:\n  - {name: m, type: memory, min_available_fraction: 100%}\n"},
     ["vet", "run", "p.yaml", "--local", "--out", "o"]),
    ("hpcml run aborted by vetting", 4, "hpcml run --vet",
     {"p.yaml": "name: x\nevals:\n  - {name: m, type: memory, min_available_fraction: 100%}\n"},
     ["run", "--vet", "p.yaml", "--dir", "j", "--", "true"]),
    ("scan of a file that imports os.system", 6, "dangerous",
     {"evil.pkl": b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."}, ["scan", "evil.pkl"]),
    ("scan of a file that cannot be parsed", 7, "could not be read or parsed",
     {"broken.pkl": b"\x80\x04\x95garbage"}, ["scan", "broken.pkl"]),
    ("scan of a GGUF model (a format hpcml does not read)", 8, "does not read",
     {"m.gguf": b"GGUF\x03\x00\x00\x00" + bytes(16)}, ["scan", "m.gguf"]),
    ("vet continue", 0, "continue", {"p.yaml": "name: x\nevals:\n  - {name: m, type: memory, min_available_fraction: 1%}\n"},
     ["vet", "run", "p.yaml", "--local", "--out", "o"]),
]


@pytest.mark.parametrize("what,code,words,files,argv", PROBES, ids=[p[0] for p in PROBES])
def test_documented_code(tmp_path, what, code, words, files, argv):
    for name, content in files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    p = hpcml(*argv, cwd=tmp_path)
    assert p.returncode == code, (what, p.returncode, p.stderr[-400:])
    assert words in table()[code]
    if code == 2:
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
