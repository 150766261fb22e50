"""A text file is not a model file, though protocol 0 reads some of it.

Protocol 0 and 1 pickles have no header and protocol 0 is printable text, so the
first line of a source file, a requirements list or a YAML config often reads as an
opcode: ``import setuptools`` as INST, ``cd build`` or ``cluster: hpc`` as GLOBAL. Such
a file is "not a model file" (``scanned`` False), neither dangerous nor unknown. A text
file that really is a protocol-0 pickle (it parses to its STOP, and ``pickle.load``
would run it) stays dangerous whatever its name, valid UTF-8 or not.
"""

from __future__ import annotations

import pickletools

import pytest

from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file

# name -> text; each is valid UTF-8 whose first bytes read as a protocol-0 opcode.
TEXTS = {
    "setup.py": 'import setuptools\nsetuptools.setup(name="x")\n',
    "requirements.txt": "cython>=3\nsetuptools>=68\nnumpy\n",
    "README": "cd build\nmake install\n\nSee the documentation for the options.\n",
    "config.yaml": "cluster: hpc\nsystem: slurm\nnodes: 4\n",
    "data.csv": "cpu,util\n1,2\n3,4\n",
    "train.py": "import os\nimport sys\nprint(sys.argv)\n",
    "notes.md": "(draft) results\nIt is fine.\n",
}

# Real protocol-0 pickles that run os.system('ls') when loaded.
PICKLES = {
    "global_reduce": "cos\nsystem\n(S'ls'\ntR.",
    "inst": "(S'ls'\nios\nsystem\n.",
    "trailing_text": "cos\nsystem\n(S'ls'\ntR.\nThe rest of this file is notes.\n",
    "non_ascii_argument": "cos\nsystem\n(Vecho \u00e9t\u00e9\ntR.",
}
PICKLE_NAMES = ("notes.txt", "setup.py", "requirements.txt", "README", "config.yaml", "data.csv", "model.pkl")


def _parses_to_stop(data: bytes) -> bool:
    try:
        return any(op.name == "STOP" for op, _arg, _pos in pickletools.genops(data))
    except Exception:  # noqa: BLE001 - not a pickle
        return False


def _first_opcode_reads(data: bytes) -> bool:
    try:
        next(iter(pickletools.genops(data)))
        return True
    except Exception:  # noqa: BLE001
        return False


def _show(result) -> str:
    return f"{result.verdict.value} scanned={result.scanned} {[f.name for f in result.findings]} {result.errors}"


def test_the_cases_are_what_they_claim():
    for text in TEXTS.values():
        data = text.encode("utf-8")
        assert _first_opcode_reads(data) and not _parses_to_stop(data), text
    for text in PICKLES.values():
        assert _parses_to_stop(text.encode("utf-8")), text


@pytest.mark.parametrize("name", list(TEXTS))
def test_text_file_is_not_a_model_file(name, tmp_path):
    path = tmp_path / name
    path.write_text(TEXTS[name], encoding="utf-8")
    result = scan_file(path)
    assert not result.scanned, _show(result)
    assert result.verdict not in (Verdict.DANGEROUS, Verdict.UNKNOWN), _show(result)


@pytest.mark.parametrize("name", list(TEXTS))
def test_text_named_like_a_pickle_is_never_safe(name, tmp_path):
    """model.pkl says it is a pickle: text that is not one is an error there, never safe."""
    path = tmp_path / "model.pkl"
    path.write_text(TEXTS[name], encoding="utf-8")
    result = scan_file(path)
    assert result.verdict is not Verdict.SAFE, _show(result)


@pytest.mark.parametrize("name", PICKLE_NAMES)
@pytest.mark.parametrize("kind", list(PICKLES))
def test_text_that_is_a_real_pickle_is_dangerous(kind, name, tmp_path):
    path = tmp_path / name
    path.write_text(PICKLES[kind], encoding="utf-8")
    result = scan_file(path)
    assert result.verdict is Verdict.DANGEROUS, _show(result)
    assert result.scanned and "os.system" in {f.name for f in result.findings}, _show(result)
