"""``farm create``: one record per task, idempotent, appending never renumbers."""

from __future__ import annotations

import json

import pytest

from hpcml.errors import UsageError
from hpcml.farm import store
from hpcml.farm.model import TaskSpec


def _ids(farm):
    return [(t.id, t.command) for t in store.load(farm).tasks]


def test_create_is_idempotent_and_appends_with_new_ids(tmp_path):
    farm = tmp_path / "f"
    specs = [TaskSpec("a"), TaskSpec("b"), TaskSpec("a")]          # a repeated line is two tasks
    assert store.create(farm, specs).added == 3
    before = _ids(farm)
    again = store.create(farm, specs)
    assert (again.added, again.existing, again.total) == (0, 3, 3)
    assert _ids(farm) == before
    more = store.create(farm, [TaskSpec("c"), TaskSpec("a"), TaskSpec("a"), TaskSpec("a"), TaskSpec("b")])
    assert more.added == 2                                           # c and a third a
    assert _ids(farm) == before + [(3, "c"), (4, "a")]


def test_same_command_in_two_groups_or_with_other_params_is_another_task(tmp_path):
    farm = tmp_path / "f"
    store.create(farm, [TaskSpec("x", group="g1"), TaskSpec("x", group="g2"), TaskSpec("x", params={"p": 1})])
    assert len(store.load(farm).tasks) == 3


def test_settings_are_kept_and_updated(tmp_path):
    farm = tmp_path / "f"
    store.create(farm, [TaskSpec("a")], {"retries": 5, "time_limit": 9.0})
    store.create(farm, [TaskSpec("b")], {"backoff": 0.5})
    s = store.load(farm).settings
    assert (s.retries, s.time_limit, s.backoff) == (5, 9.0, 0.5)
    assert store.load(farm, {"retries": 1}).settings.retries == 1


def test_another_version_or_not_a_farm_is_refused(tmp_path):
    farm = tmp_path / "f"
    store.create(farm, [TaskSpec("a")])
    doc = json.loads((farm / "farm.json").read_text())
    (farm / "farm.json").write_text(json.dumps({**doc, "schema": "hpcml.farm/2"}))
    with pytest.raises(UsageError, match="newer hpcml"):
        store.load(farm)
    with pytest.raises(UsageError, match="not a farm directory"):
        store.load(tmp_path / "nothing")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("")
    with pytest.raises(UsageError, match="not empty"):
        store.create(tmp_path / "other", [TaskSpec("a")])


def test_after_must_name_known_tasks(tmp_path):
    with pytest.raises(UsageError, match="task 7: a task may only wait for an earlier one"):
        store.create(tmp_path / "f", [TaskSpec("a", after=(7,))])
    assert not (tmp_path / "f" / "tasks.jsonl").exists()


def test_a_later_create_may_wait_for_a_group_made_earlier(tmp_path):
    store.create(tmp_path / "f", [TaskSpec("train 1", group="train"), TaskSpec("train 2", group="train")])
    store.create(tmp_path / "f", [TaskSpec("eval", group="eval", after=("train",))])
    assert store.load(tmp_path / "f").tasks[-1].after == ("train",)
    with pytest.raises(UsageError, match="group 'trian', which no task has"):
        store.create(tmp_path / "f", [TaskSpec("eval2", after=("trian",))])


def test_every_task_line_carries_the_schema_tag_and_a_newer_one_is_refused(tmp_path):
    farm = tmp_path / "f"
    store.create(farm, [TaskSpec("a"), TaskSpec("b")])
    store.create(farm, [TaskSpec("c")])                              # appended lines too
    path = farm / "tasks.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [d["schema"] for d in lines] == ["hpcml.farm.task/1"] * 3
    path.write_text("".join(json.dumps({k: v for k, v in d.items() if k != "schema" or i == 0}) + "\n"
                            for i, d in enumerate(lines)))             # a farm of an older hpcml: read
    assert [t.command for t in store.load(farm).tasks] == ["a", "b", "c"]
    lines[2]["schema"] = "hpcml.farm.task/2"
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    with pytest.raises(UsageError, match=r"tasks.jsonl:3: key 'schema': written by a newer hpcml"):
        store.load(farm)


def test_a_task_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    """A task's program shares the farm directory: a FIFO put in place of tasks.jsonl is one
    line naming the file (exit 2 from the CLI), not a farm command that waits for ever."""
    import os
    import threading
    farm = tmp_path / "f"
    store.create(farm, [TaskSpec("true")], {})
    (farm / "tasks.jsonl").unlink()
    os.mkfifo(farm / "tasks.jsonl")
    got: list = []

    def load() -> None:
        try:
            store.load(farm)
        except UsageError as exc:
            got.append(str(exc))
    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive() and got and "a FIFO, not a regular file" in got[0] and "tasks.jsonl" in got[0], got


def test_a_spec_edited_between_two_creates_is_added_again(tmp_path):
    """A task's identity is made at each ``create`` (the review found it kept on the spec
    once made, so a caller who changed ``params`` had the edited task skipped)."""
    spec = TaskSpec(command="echo hi", params={"lr": 1})
    assert store.create(tmp_path / "f", [spec]).added == 1
    spec.params["lr"] = 2
    assert store.create(tmp_path / "f", [spec]).added == 1
