"""A shared sweep file through the real ``farm create`` and ``farm run``: a value is a value.

Each task runs a small program that appends its argv to a file (O_APPEND, one write), so
the test reads what the user's program received, not what hpcml recorded."""

from __future__ import annotations

import json
import sys

import yaml

from tests.farm.farmtools import hpcml

ARGV = "import json, os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)\n" \
       "os.write(fd, (json.dumps(sys.argv[2:]) + '\\n').encode())\n"


def test_injected_values_are_inert_and_arrive_exactly_and_raw_is_the_opt_out(tmp_path):
    marker, out = tmp_path / "pwned", tmp_path / "argv.jsonl"
    (tmp_path / "argv.py").write_text(ARGV)
    (tmp_path / "glob-me").write_text("")
    values = [f"b; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", "a'b", 'a"b', "x\ny", "a  b", "*",
              "\\", "$HOME", "-n"]
    prog = f"{sys.executable} {tmp_path}/argv.py {out}"
    sweep = {"tasks": [
        {"group": "shared", "command": f"""{prog} {{v}} '{{v}}' "{{v}}" "run {{v}}.log" --v={{v}}""",
         "product": {"v": values}},
        {"group": "raw", "command": f"{prog} {{flags}} && touch {tmp_path}/raw-ran", "raw": ["flags"],
         "product": {"flags": ["--a 1 --b 2"]}},
    ]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    farm = tmp_path / "f"
    p = hpcml("farm", "create", farm, tmp_path / "s.yaml")
    assert p.returncode == 0, p.stderr
    p = hpcml("farm", "run", farm, "--slots", "2", "--retries", "0", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    seen = [json.loads(line) for line in out.read_text().splitlines()]
    want = [[v, v, v, f"run {v}.log", f"--v={v}"] for v in values] + [["--a", "1", "--b", "2"]]
    assert sorted(seen) == sorted(want)
    assert not marker.exists()                      # nothing a value said was run
    assert (tmp_path / "raw-ran").exists()          # raw: the value is shell, as asked
