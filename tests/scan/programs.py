"""Random pickle programs over the stack, marks and memo, for differential tests of the
walker and the fast path against CPython's own unpickler."""

from __future__ import annotations

import random
import struct

WORDS = ["collections", "OrderedDict", "os", "system", "builtins", "getattr", "a", "b"]


def random_program(rng: random.Random) -> bytes:
    out = [b"\x80\x04"]
    for _ in range(rng.randint(1, 20)):
        op = rng.choice("SSSSSSSMMPPRGJXKYDTIQQQUEL")
        if op == "S":
            w = rng.choice(WORDS).encode()
            out.append(b"\x8c" + bytes([len(w)]) + w)
        elif op == "M":
            out.append(b"\x94")
        elif op == "P":
            out.append(b"q" + bytes([rng.randint(0, 7)]))
        elif op == "R":
            out.append(b"r" + struct.pack("<I", rng.choice([0, 1, 2, 3, 7, 300])))
        elif op == "G":
            out.append(b"h" + bytes([rng.randint(0, 7)]))
        elif op == "J":
            out.append(b"j" + struct.pack("<I", rng.randint(0, 7)))
        else:
            out.append({"X": b"0", "K": b"(", "Y": b"1", "D": b"2", "T": b")", "I": b"K\x05",
                        "Q": b"\x93", "U": b"\x86", "E": b"}", "L": b"]"}[op])
    out.append(b"N.")
    return b"".join(out)
