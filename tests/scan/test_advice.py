"""The advice ``hpcml scan`` prints for ``unknown`` files: every policy line it prints is
one the policy parser accepts, and what no policy can allow is said, not offered."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

from hpcml.scan.policy import load_policy


class Model:  # a user's class: pickled by name, not on the allowlist
    pass


def _rot13_call(path: Path) -> Path:
    """A pickle that calls os.system by a name built at load time: codecs.encode('bf', 'rot13')."""
    def s(x: str) -> bytes:
        return b"\x8c" + bytes([len(x)]) + x.encode()
    path.write_bytes(b"\x80\x04c_codecs\nencode\nq\x00" + s("bf") + s("rot13") + b"\x86R"
                     + b"h\x00" + s("flfgrz") + s("rot13") + b"\x86R\x93" + s("true") + b"\x85R.")
    return path


def test_every_printed_policy_line_parses_and_built_names_are_not_offered(tmp_path):
    built = _rot13_call(tmp_path / "rot13.pkl")
    user = tmp_path / "user.pkl"
    user.write_bytes(pickle.dumps(Model(), protocol=4))
    out = subprocess.run([sys.executable, "-m", "hpcml", "scan", str(built), str(user)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 5, out.stderr
    items = [line for line in out.stdout.splitlines() if line.startswith("  - ")]
    assert items == [f"  - {__name__}.Model"], out.stdout
    for i, line in enumerate(items):               # each one, alone, is a policy the parser takes
        (tmp_path / f"p{i}.yaml").write_text(f"safe:\n{line}\n")
        load_policy(tmp_path / f"p{i}.yaml")
    assert "No policy can allow what is not a named global" in out.stdout, out.stdout
    policy = tmp_path / "all.yaml"
    policy.write_text("safe:\n" + "\n".join(items) + "\n")
    again = subprocess.run([sys.executable, "-m", "hpcml", "scan", "--policy", str(policy), str(built), str(user)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 5 and "safe:" not in again.stdout, again.stdout    # rot13 stays blocked
    ok = subprocess.run([sys.executable, "-m", "hpcml", "scan", "--policy", str(policy), str(user)],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout


def test_a_call_refused_by_its_argument_check_is_said_not_offered_for_the_allowlist(tmp_path):
    """fractions.Fraction is allowlisted; Fraction('1e30000000') is refused by its argument
    check. The advice says which check refused it, and never offers to allow the name."""
    p = tmp_path / "frac.pkl"
    p.write_bytes(b"\x80\x04\x8c\x09fractions\x8c\x08Fraction\x93\x8c\x071e3.5/2\x85R.")      # not 'n', 'n/d'
    out = subprocess.run([sys.executable, "-m", "hpcml", "scan", str(p)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 5, (out.stdout, out.stderr)
    assert "  - fractions.Fraction" not in out.stdout, out.stdout
    flat = " ".join(out.stdout.split())
    assert "Allowed already, but a call was refused by its argument check" in flat, out.stdout
    assert "fractions.Fraction: Fraction given text" in flat, out.stdout
