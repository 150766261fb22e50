"""Hostile or broken inputs of ``farm create`` / ``farm run``, written the way a user writes
them: a value stays a value next to a ``#`` comment and in a here-document, a NUL byte or a
huge sweep is one line (exit 2) and not a dead worker or minutes of work, and a damaged
tasks.jsonl is one line naming the file, never a traceback."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from hpcml.errors import UsageError
from hpcml.farm import store, sweep
from hpcml.farm.model import TaskSpec
from hpcml.farm.sweep import parse_sweep, parse_task_file
from hpcml.farm.template import COMMAND_MAX, fill
from tests.farm.farmtools import ends, hpcml


def _sweep(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return parse_sweep(p)


def _one_line_error(tmp_path, text) -> str:
    with pytest.raises(UsageError) as err:
        _sweep(tmp_path, text)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(tmp_path / "s.yaml")), msg
    return msg


# --- 1. the quoting tracker knows # comments and here-documents -------------------------

def test_a_comment_and_a_here_document_in_a_shared_sweep_run_no_value(tmp_path):
    """The review's repro sweeps through the real farm create and run: the values arrive
    as text (the task's output, the file the here-document wrote) and run nothing."""
    m1, m2, m3 = tmp_path / "pwned-comment", tmp_path / "pwned-heredoc", tmp_path / "pwned-backquote"
    tag = f"x; touch {m1}"
    lrs = ["0.1", f"$(touch {m2})", f"`touch {m3}`", "\\ 'q' \"d\" $HOME"]
    doc = {"tasks": [
        {"group": "comment", "command": "# the tag isn't used for anything but the log name\necho tag={tag}\n",
         "product": {"tag": ["a", tag]}},
        {"group": "heredoc", "command": "cat > config.yaml <<EOF\nlr: {lr}\nEOF\necho ran\n",
         "product": {"lr": lrs}},
    ]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    farm = tmp_path / "f"
    p = hpcml("farm", "create", farm, tmp_path / "s.yaml")
    assert p.returncode == 0, p.stderr
    p = hpcml("farm", "run", farm, "--slots", "2", "--retries", "0", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert not m1.exists() and not m2.exists() and not m3.exists()
    tasks = {t.id: t for t in store.load(farm).tasks}
    outs = {tid: (farm / "logs" / f"{tid}.{att}.out").read_text() for tid, att in ends(farm)}
    assert outs[1] == f"tag={tag}\n"
    configs = {t.params["lr"]: (farm / "tasks" / str(t.id) / "config.yaml").read_text()
               for t in tasks.values() if t.group == "heredoc"}
    assert configs == {lr: f"lr: {lr}\n" for lr in lrs}


VALUES = ["b; touch {m}", "a'b", 'a"b', "$(touch {m})", "`touch {m}`", "a  b", "*", "\\", "-n", "", "'",
          "\"'$`\\", "$HOME", "${HOME}", "\\$(touch {m})", "$", "EOF x", "\ta", "# not a comment"]
# a template -> what it prints, {} standing for the value
PLACES = {
    "# it's a comment\nprintf '%s\\n' {x}": "{}\n",
    "printf '%s\\n' {x} # isn't it\n": "{}\n",
    "printf '%s\\n' a#b {x}": "a#b\n{}\n",
    "cat <<EOF\n{x}\nEOF": "{}\n",
    "cat <<EOF\nlr: {x} it's\nEOF\nprintf '%s\\n' {x}": "lr: {} it's\n{}\n",
    "cat <<'EOF'\n{x}\nEOF\nprintf '%s\\n' {x}": "{}\n{}\n",
    "cat <<\"EOF\"\n'{x}'\nEOF": "'{}'\n",
    "cat <<-EOF\n\t{x}\n\tEOF\nprintf '%s\\n' {x}": "{}\n{}\n",
    "cat <<A; cat <<'B' # it's\na {x}\nA\nb {x}\nB\nprintf '%s\\n' {x}": "a {}\nb {}\n{}\n",
    "printf '%s\\n' $(( 1 << 2 )) {x}": "4\n{}\n",
    "printf '%s\\n' \"$(cat <<EOF\n{x}\nEOF\n)\" {x}": "{}\n{}\n",
    "printf '%s\\n' `echo a # it's` {x}": "a\n{}\n",
    "printf '%s\\n' ${{HOME:+a<<b}} {x}": "a<<b\n{}\n",
    "cat <<\\\nEOF\n{x}\nEOF": "{}\n",                   # \<newline> joins lines: EOF is unquoted
    "printf '%s\\n' $${x} | sed 's/^[0-9]*//'": "{}\n",        # $$ is the PID: {x} is not after a lone $
    "printf '%s\\n' ${{HOME:+a #b}} ${{HOME:+'}}'}} {x}": "a\n#b\n}\n{}\n",
}


@pytest.mark.parametrize("shell", ["/bin/sh", "bash"])
def test_a_value_after_a_comment_or_in_a_here_document_is_its_exact_text(tmp_path, shell):
    marker = tmp_path / "pwned"
    for place, want in PLACES.items():
        for v in (v.replace("{m}", str(marker)) for v in VALUES):
            if "<<-" in place and v.startswith("\t"):
                continue                # <<- strips a body line's leading tabs: the shell's, not the value's
            cmd = fill(place, {"x": v})
            out = subprocess.run([shell, "-c", cmd], capture_output=True, text=True, cwd=tmp_path, timeout=30)
            assert out.stdout == want.replace("{}", v), (place, v, cmd, out.stderr)
    assert not marker.exists()


@pytest.mark.parametrize("command, value, problem", [
    ("echo a # lr {lr}", "1", "inside a # comment"),
    ("# it's\necho a # lr {lr}", "1", "inside a # comment"),
    ("cat <<EOF\nlr: {lr}\nEOF\necho ran", "a\nEOF\ntouch pwned", "a newline in its value"),
    ("cat <<'EOF'\nlr: {lr}\nEOF\necho ran", "a\nEOF\ntouch pwned", "a newline in its value"),
    ("cat <<EOF\n{lr}\nEOF\necho ran", "EOF", "ends the here-document early"),
    ("cat <<-EOF\n{lr}\nEOF\necho ran", "\t\tEOF", "ends the here-document early"),
    ("cat <<{lr}\nx\n", "EOF", "here-document's delimiter"),
    ("cat << {lr}\nx\n", "EOF", "here-document's delimiter"),
    ("cat <<EOF\nlr: $(echo {lr})\nEOF", "1", "no quoting protects"),
    ("cat <<EOF\nlr: ${lr}\nEOF", "(touch pwned)", "no quoting protects"),
    ("echo ${lr} ok", "a\\", "follows a $"),
    ("((y = 1 << 2)); echo {lr}", "1", "comes after ((, which bash and sh (dash) read differently"),
    ("echo $[1 << 2] {lr}", "1", "comes after $["),
    ("echo $((cat <<EOF) )\n{lr}\nEOF", "$(touch pwned)", "comes after $((...) that is not arithmetic"),
    ("cat <<EOF\nE\\\nOF\n{lr}\nEOF", "$(touch pwned)", "a here-document line ending in a backslash"),
    ("echo $(( {lr} + 1 ))", "$(touch pwned)", "inside arithmetic"),
    ('echo "${{x:-{lr}}}"', "$(touch pwned)", "inside \"${...}\" in double quotes"),
])
def test_a_placeholder_no_quoting_protects_is_one_line_naming_the_command(tmp_path, command, value, problem):
    text = yaml.safe_dump({"command": command, "product": {"lr": [value]}})
    msg = _one_line_error(tmp_path, text)
    assert "key 'command'" in msg and problem in msg, msg


def test_the_directory_reference_in_here_documents(tmp_path):
    assert fill("cat <<EOF\nd: {task_dir}\nEOF", {}) == "cat <<EOF\nd: ${HPCML_FARM_TASK_DIR}\nEOF"
    msg = _one_line_error(tmp_path, yaml.safe_dump({"command": "cat <<'EOF'\nd: {task_dir}\nEOF"}))
    assert "key 'command'" in msg and "not expanded" in msg, msg


def test_a_hostile_comment_sweep_through_the_cli_is_refused_in_one_line(tmp_path):
    (tmp_path / "s.yaml").write_text("command: |\n  echo tag={tag}  # the tag's {tag}\n"
                                     "product:\n  tag: [a, \"x\\ntouch pwned\"]\n")
    p = hpcml("farm", "create", tmp_path / "f", tmp_path / "s.yaml")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"{tmp_path / 's.yaml'}:1: key 'command'" in p.stderr and "# comment" in p.stderr, p.stderr
    assert not (tmp_path / "f").exists()


# --- 2. a NUL byte ---------------------------------------------------------------------

def test_a_nul_byte_is_refused_at_create_in_a_task_file_and_a_sweep(tmp_path):
    tasks = tmp_path / "t.txt"
    tasks.write_bytes(b"echo fine\necho a\0b\n")
    p = hpcml("farm", "create", tmp_path / "f", tasks)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"{tasks}:2: " in p.stderr and "NUL" in p.stderr, p.stderr
    assert not (tmp_path / "f").exists()
    msg = _one_line_error(tmp_path, 'command: echo {a}\nproduct: {a: [ok, "x\\0y"]}\n')
    assert "s.yaml:2: key 'product.a'" in msg and "NUL" in msg, msg
    msg = _one_line_error(tmp_path, 'command: "echo \\0 {a}"\nproduct: {a: [ok]}\n')
    assert "key 'command'" in msg and "NUL" in msg, msg


@pytest.mark.parametrize("command, why", [("echo a\0b", "NUL"), ("x" * (COMMAND_MAX + 1), "longer than one can be"),
                                          (b"echo bytes", "must be text, not bytes")])
def test_the_store_a_python_caller_creates_through_refuses_what_the_files_readers_do(tmp_path, command, why):
    with pytest.raises(UsageError, match=why):
        store.create(tmp_path / "f", [TaskSpec(command="echo fine"), TaskSpec(command=command)])
    assert not (tmp_path / "f").exists()


def test_a_task_that_cannot_start_is_recorded_failed_and_the_others_run(tmp_path):
    """A NUL in tasks.jsonl (written by another tool): the attempt ends "failed" with the
    reason in its stderr, not "lost" with a dead worker."""
    farm = tmp_path / "f"
    store.create(farm, [TaskSpec("echo a@NUL@b"), TaskSpec(f"touch {tmp_path}/ran")])     # create refuses a NUL
    tasks = farm / store.TASKS_FILE
    tasks.write_text(tasks.read_text().replace("@NUL@", "\\u0000"))
    p = hpcml("farm", "run", farm, "--slots", "1", "--retries", "0", timeout=120)
    assert p.returncode != 2 and "Traceback" not in p.stderr, p.stderr
    rec = ends(farm)
    assert {tid: e["outcome"] for (tid, _), e in rec.items()} == {0: "failed", 1: "ok"}
    (att,) = [a for (tid, a) in rec if tid == 0]
    assert "cannot start" in (farm / "logs" / f"0.{att}.err").read_text()
    assert (tmp_path / "ran").exists()


# --- 3. bounded expansion ----------------------------------------------------------------

@pytest.mark.parametrize("text, where", [
    ("command: t {a}\nproduct: {a: [1]}\nrepeat: 3000000\n", "s.yaml:3: key 'repeat'"),
    ("command: t {a}\nrandom: {samples: 100000000, seed: 0, params: {a: {uniform: [0, 1]}}}\n",
     "key 'random.samples'"),
    (f"command: t {{a}} {{b}}\nproduct: {{a: {list(range(1001))}, b: {list(range(1000))}}}\n", "key 'product.a'"),
    ("tasks:\n  - {command: 't {a}', repeat: 600000, product: {a: [1]}}\n"
     "  - {command: 'u {a}', repeat: 600000, product: {a: [1]}}\n", "key 'tasks[1].repeat'"),
])
def test_a_sweep_over_the_task_bound_is_refused_before_it_is_expanded(tmp_path, text, where):
    began = time.monotonic()
    msg = _one_line_error(tmp_path, text)
    assert time.monotonic() - began < 10
    assert where in msg and f"{sweep.MAX_TASKS:,} one sweep may have" in msg, msg


def test_the_task_bound_is_the_product_of_the_parts(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "MAX_TASKS", 12)
    text = "command: t {a} {b} {c}\nproduct: {a: [1, 2], b: [1, 2, 3]}\nzip: {c: [1, 2]}\n"
    assert len(_sweep(tmp_path, text)[0]) == 12
    msg = _one_line_error(tmp_path, text + "repeat: 2\n")
    assert "24 tasks" in msg, msg


@pytest.mark.parametrize("command, problem", [
    ("t {a:>99999999999}", "format width or precision"),
    ("t {a:.99999999999f}", "format width or precision"),
    (f"t {{a:>{COMMAND_MAX}}}", "longer than one can be"),
])
def test_a_command_over_the_length_bound_is_one_line(tmp_path, command, problem):
    msg = _one_line_error(tmp_path, yaml.safe_dump({"command": command, "product": {"a": [1.5]}}))
    assert "key 'command'" in msg and problem in msg, msg


def test_a_task_file_line_over_the_length_bound_is_refused(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("echo ok\necho " + "x" * COMMAND_MAX + "\n")
    with pytest.raises(UsageError, match=r"t\.txt:2: a command is longer"):
        parse_task_file(p)


# --- 4. one line instead of a traceback --------------------------------------------------

@pytest.mark.parametrize("text, where, problem", [
    ("command: echo {a[x]}\nproduct: {a: [abc]}\n", "s.yaml:1: key 'command'", "cannot fill the template"),
    ("command: echo {a[0]}\nproduct: {a: [5]}\n", "s.yaml:1: key 'command'", "cannot fill the template"),
    ("command: echo {a:.1f}\nproduct: {a: [" + "9" * 400 + "]}\n", "key 'command'", "cannot fill the template"),
    ("command: echo {a}\nrandom: {samples: 2, seed: 1, params: {a: {randint: [5, 1]}}}\n",
     "s.yaml:2: key 'random.params.a'", "low <= high"),
])
def test_template_and_distribution_errors_are_one_line(tmp_path, text, where, problem):
    msg = _one_line_error(tmp_path, text)
    assert where in msg and problem in msg, msg


def _rec(fields: str) -> str:
    """A tasks.jsonl line with its tag and these JSON ``fields``."""
    return '{"schema": "hpcml.farm.task/1", ' + fields + "}"


DAMAGED = {
    "group": (_rec('"id": 1, "command": "true", "group": ["a"]'), "'group' must be"),
    "after": (_rec('"id": 1, "command": "true", "after": [[1]]'), "'after' must be"),
    "huge id": (_rec('"id": 1e400, "command": "true"'), "'id' must be a whole number"),
    "id text": (_rec('"id": "1", "command": "true"'), "'id' must be a whole number"),
    "negative id": (_rec('"id": -1, "command": "true"'), "'id' must be a whole number"),
    "command": (_rec('"id": 1, "command": ["true"]'), "'command' must be a string"),
    "deep": (_rec('"id": 1, "command": "true", "params": {"a": ' + "[" * 100000 + "]" * 100000 + "}"),
             "nested too deeply"),
    "deep params": (_rec('"id": 1, "command": "true", "params": {"a": ' + "[" * 200 + "]" * 200 + "}"),
                    "'params' must be a mapping nested at most"),
    "same id": (_rec('"id": 0, "command": "false"'), "task id 0 appears twice"),
    "no command": (_rec('"id": 1'), "missing 'command'"),
}


def _damaged_farm(tmp_path, line: str):
    farm = tmp_path / "f"
    store.create(farm, [TaskSpec("true")])
    with open(farm / "tasks.jsonl", "a") as f:
        f.write(line + "\n")
    return farm


@pytest.mark.parametrize("name", DAMAGED)
def test_a_damaged_task_record_is_one_line_naming_the_file_and_line(tmp_path, name):
    line, problem = DAMAGED[name]
    farm = _damaged_farm(tmp_path, line)
    with pytest.raises(UsageError) as err:
        store.load(farm)
    msg = str(err.value)
    assert msg.startswith(f"{farm / 'tasks.jsonl'}:2: a task record is damaged: ") and problem in msg, msg
    assert "\n" not in msg and len(msg) < 300, msg


@pytest.mark.parametrize("name", ["group", "deep", "huge id"])
def test_status_results_and_create_on_a_damaged_farm_are_one_line_exit_2(tmp_path, name):
    line, problem = DAMAGED[name]
    farm = _damaged_farm(tmp_path, line)
    (tmp_path / "t.txt").write_text("echo more\n")
    for args in (["status", farm], ["results", farm], ["create", farm, tmp_path / "t.txt"]):
        p = hpcml("farm", *args)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, (args, p.stderr)
        assert f"{farm / 'tasks.jsonl'}:2" in p.stderr and problem in p.stderr, (args, p.stderr)
    assert [json.loads(s)["id"] for s in (farm / "tasks.jsonl").read_text().splitlines()[:1]] == [0]


# pieces of shell a template is made of, for templates no one thought of (a fixed seed)
PIECES = ["echo a", " ", "'", '"', "# it's x", "\n", "cat <<EOF\n", "cat <<'EOF'\n", "EOF\n", "$(", ")", "`", "\\",
          "{x}", "{x}", "{x}", ";", "<<", "#", "$", "((", "$((1<<2))", "${{HOME:-a}}", "cat <<-EOF\n", "\t", "(",
          "<", "case a in a) echo;; esac", "${{", "}}", "$[", "]", "|", "<<<", 'cat <<E"O"F\n', "cat <<\\EOF\n",
          "$'", "\"$(", ")\"", "\\\n", "cat <<EOF; echo {x}\n", "echo {x} # x\n", "$((", "))", '"${{', '"{x}"']


def test_random_templates_run_no_value(tmp_path):
    """Whatever a template looks like, fill either refuses it or gives a command in which
    a hostile value runs nothing, under sh (dash) and bash."""
    import random
    rng = random.Random(20261129)
    marker = tmp_path / "pwned"
    values = [f"a'b;touch {marker};#", f"$(touch {marker})", f"`touch {marker}`", f"\\'; touch {marker}; '",
              f"x\ntouch {marker}\n", f"EOF\ntouch {marker}", f"\"; touch {marker}; \"", f"$(touch {marker})\\"]
    ran = []
    for _ in range(400):
        template = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12)))
        value = rng.choice(values)
        try:
            cmd = fill(template, {"x": value})
        except (ValueError, KeyError, IndexError):      # TemplateError, or a template Python cannot parse
            continue
        for shell in ("/bin/sh", "bash"):
            try:
                subprocess.run([shell, "-c", cmd], stdin=subprocess.DEVNULL, capture_output=True, timeout=5,
                               cwd=tmp_path)
            except subprocess.TimeoutExpired:
                pass
            if marker.exists():
                ran.append((shell, template, value, cmd))
                marker.unlink()
    assert not ran, ran[:3]
