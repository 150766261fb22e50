"""``hpcml.ports``: a port picked now for a listener that binds it later (rank 0's TCPStore,
a service) is one no outgoing connection on the node can take in between.

The race is shown for real in a network namespace of the test's own (``unshare -n``, as
root): its ephemeral range is narrowed to 16 ports (the sysctl is per namespace, so the
machine's own is untouched), 16 outgoing connections then hold every one of them, and the
listener must still bind the port it was given. A port the kernel handed out itself
(``bind(('', 0))``) lies in that range and is taken by then: the old way fails this test.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import textwrap

import pytest

from hpcml.ports import candidates, ephemeral_range, free_port, port_free

NARROW = (40000, 40015)

SCRIPT = textwrap.dedent("""
    import errno, socket, sys
    from hpcml.ports import free_port, ephemeral_range
    assert ephemeral_range() == {narrow!r}, ephemeral_range()
    chosen = free_port("127.0.0.1")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))        # the one port the kernel picks: the connections' target
    server.listen(64)
    held = []
    while True:                          # every ephemeral port held by an outgoing connection
        c = socket.socket()
        try:
            c.connect(server.getsockname())
        except OSError as exc:
            assert exc.errno == errno.EADDRNOTAVAIL, exc
            c.close()
            break
        held.append(c)
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", chosen))
    except OSError as exc:
        print(f"taken {{chosen}} {{exc.errno}} after {{len(held)}} connections")
        sys.exit(1)
    listener.listen(1)
    print(f"bound {{chosen}} after {{len(held)}} connections")
""")


@pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("ip") is None,
                    reason="needs util-linux's unshare and iproute2's ip (both on Debian's base system)")
def test_the_port_survives_every_ephemeral_port_taken_by_outgoing_connections():
    inner = (f"ip link set lo up && echo '{NARROW[0]} {NARROW[1]}' > /proc/sys/net/ipv4/ip_local_port_range && "
             f"exec {sys.executable} -c \"$0\"")
    out = subprocess.run(["unshare", "-n", "sh", "-c", inner, SCRIPT.format(narrow=NARROW)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    words = out.stdout.split()
    assert words[0] == "bound" and not NARROW[0] <= int(words[1]) <= NARROW[1]
    assert int(words[3]) >= NARROW[1] - NARROW[0]       # the range was used up (one port is the server's)


def test_a_port_is_outside_the_range_and_free():
    lo, hi = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert not lo <= port <= hi and port >= 10000
        assert port_free("", port)


def test_candidates_cover_both_sides_of_the_range_and_nothing_in_it():
    rng = random.Random(7)
    seen = candidates((32768, 60999), rng, n=4000)
    assert len(seen) == len(set(seen)) == 4000
    assert all(10000 <= p < 32768 or 60999 < p <= 65535 for p in seen)
    assert any(p > 60999 for p in seen) and any(p < 32768 for p in seen)


def test_a_range_that_leaves_nothing_outside_is_the_kernel_s_choice(caplog):
    """A node configured with every port above 10000 ephemeral: no candidate, and the
    kernel's own pick (still a free port), said in the log."""
    assert candidates((1024, 65535), random.Random(1)) == []
    with caplog.at_level("INFO", logger="hpcml.ports"):
        port = free_port("127.0.0.1", ephemeral=(1024, 65535))
    assert 0 < port < 65536 and "ephemeral range" in caplog.text


def test_an_unreadable_range_file_is_the_kernel_s_default(tmp_path):
    bad = tmp_path / "range"
    bad.write_text("garbage\n")
    assert ephemeral_range(bad) == (32768, 60999)
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)
    (tmp_path / "ok").write_text("20000\t30000\n")
    assert ephemeral_range(tmp_path / "ok") == (20000, 30000)
