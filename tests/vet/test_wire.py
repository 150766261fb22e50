import random

from hpcml.vet import wire


def test_interleaved_lines_from_many_nodes_reassemble():
    payloads = {f"n{i}": {"node": f"n{i}", "blob": [random.random() for _ in range(400)]} for i in range(5)}
    lines = [(node, line) for node, p in payloads.items() for line in wire.encode(node, p).splitlines()]
    assert all(len(line) < 1024 for _, line in lines)  # srun forwards lines < 1024 B whole
    assert len({node for node, _ in lines}) == 5 and len(lines) > 5
    random.Random(1).shuffle(lines)
    r = wire.Reassembler()
    done = dict(filter(None, (r.feed(line) for _, line in lines + [(None, "noise from a check")])))
    assert done == payloads


def test_damaged_report_is_no_report():
    lines = wire.encode("n1", {"x": "y" * 5000}).splitlines()
    r = wire.Reassembler()
    damaged = lines[:-1] + [lines[-1][:-10] + "!!!!!!!!!!"]
    assert [r.feed(line) for line in damaged][-1] is None
