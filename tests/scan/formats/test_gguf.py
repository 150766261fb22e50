"""GGUF (issue 47): metadata read with bounds, never ``safe``; a chat template that reaches
for interpreter internals (a Jinja2 sandbox escape, CVE-2024-34359) is ``dangerous``."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from hpcml.scan.loader import UnsafeFileError, safe_load
from hpcml.scan.model import Verdict
from tests.scan.formats.scanning import names, scan_written

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
#: the public proof of concept for CVE-2024-34359 (llama-cpp-python), in spirit
ESCAPE = ("{% for x in ().__class__.__base__.__subclasses__() %}{% if 'warning' in x.__name__ %}"
          "{{ x()._module.__builtins__['__import__']('os').popen('id').read() }}{% endif %}{% endfor %}")


def _scan(tmp_path: Path, data: bytes, name: str = "model.gguf"):
    return scan_written(tmp_path, data, name)


def _str(s: str, order: str = "<") -> bytes:
    b = s.encode()
    return struct.pack(order + "Q", len(b)) + b


def gguf(kv: list[tuple[str, int, Any]], tensors: int = 2, *, order: str = "<", version: int = 3) -> bytes:
    """A GGUF as gguf-py's GGUFWriter lays it out: header, key-values, tensor infos, padding
    to general.alignment (32), then each tensor's data padded to the alignment."""
    out = bytearray(b"GGUF" + struct.pack(order + "IQQ", version, tensors, len(kv)))
    for key, kind, value in kv:
        out += _str(key, order) + struct.pack(order + "I", kind)
        if kind == 8:
            out += _str(value, order)
        elif kind == 9:
            item, values = value
            out += struct.pack(order + "IQ", item, len(values))
            out += b"".join(_str(v, order) if item == 8 else struct.pack(order + "i", v) for v in values)
        else:
            out += struct.pack(order + {4: "I", 6: "f", 7: "?"}.get(kind, "I"), value)
    for i in range(tensors):                       # f32 [4, 4], 64 bytes each
        out += _str(f"blk.{i}.attn_q.weight", order) + struct.pack(order + "I2QIQ", 2, 4, 4, 0, i * 64)
    out += b"\0" * (-len(out) % 32)
    out += struct.pack("<16f", *range(16)) * tensors
    return bytes(out)


BASE = [("general.architecture", 8, "llama"), ("general.name", 8, "tiny"), ("llama.context_length", 4, 2048),
        ("tokenizer.ggml.model", 8, "gpt2"), ("tokenizer.ggml.tokens", 9, (8, ["<s>", "</s>", "a", "b"])),
        ("tokenizer.ggml.token_type", 9, (5, [3, 3, 1, 1])), ("tokenizer.ggml.bos_token_id", 4, 0),
        ("tokenizer.ggml.add_bos_token", 7, True)]



def test_gguf_without_template_is_not_scanned(tmp_path):
    result = _scan(tmp_path, gguf(BASE))
    assert (result.format, result.verdict) == ("gguf", Verdict.NOT_SCANNED), (result.findings, result.errors)
    assert names(result, Verdict.NOT_SCANNED) == ["GGUF tensor data"]
    assert result.notes == ["GGUF v3, 2 tensors"]


def test_a_chat_template_is_judged_by_its_syntax_tree(tmp_path):
    """ChatML uses only the conversation, loops and filters: no finding, a note says it was
    parsed (the file stays not-scanned for its tensor data)."""
    result = _scan(tmp_path, gguf([*BASE, ("tokenizer.chat_template", 8, CHATML)]))
    assert result.verdict is Verdict.NOT_SCANNED
    assert names(result, Verdict.NOT_SCANNED) == ["GGUF tensor data"]
    assert any("tokenizer.chat_template" in n and "Jinja2's parser" in n for n in result.notes), result.notes


@pytest.mark.parametrize("key", ["tokenizer.chat_template", "tokenizer.chat_template.tool_use"])
@pytest.mark.parametrize("template", [
    ESCAPE,
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ lipsum|attr('\\x5f\\x5fglobals\\x5f\\x5f') }}",
    "{{ joiner.__init__.__globals__['os'].system('id') }}",
])
def test_sandbox_escape_in_a_chat_template_is_dangerous(tmp_path, key, template):
    result = _scan(tmp_path, gguf([*BASE, ("tokenizer.chat_template", 8, CHATML), (key, 8, template)]))
    assert result.verdict is Verdict.DANGEROUS
    assert names(result, Verdict.DANGEROUS) == [f"GGUF {key}"]
    with pytest.raises(UnsafeFileError) as info:
        safe_load(tmp_path / "model.gguf")
    assert info.value.exit_code == 6


def test_big_endian_and_version_2_are_read(tmp_path):
    for data in (gguf([*BASE, ("tokenizer.chat_template", 8, ESCAPE)], order=">"),
                 gguf([*BASE, ("tokenizer.chat_template", 8, ESCAPE)], version=2)):
        assert _scan(tmp_path, data).verdict is Verdict.DANGEROUS


def _huge_count() -> bytes:
    data = bytearray(gguf(BASE))
    at = data.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 8
    data[at:at + 8] = struct.pack("<Q", 2**60)             # the tokens array claims 2**60 strings
    return bytes(data)


@pytest.mark.parametrize("data, words", [
    (gguf(BASE)[:-70], "past the end of the file"),                    # tensor data cut off
    (gguf(BASE)[:200], "more than the rest of the file holds"),        # cut inside the metadata
    (b"GGUF" + struct.pack("<IQQ", 3, 2**62, 0), "more than the rest of the file holds"),
    (_huge_count(), "more than the rest of the file holds"),
    (gguf([("general.x", 13, 0)], tensors=0), "value type 13"),
    (b"GGUF" + struct.pack("<IQQ", 9, 0, 0), "GGUF version 9"),
])
def test_malformed_gguf_is_an_error(tmp_path, data, words):
    result = _scan(tmp_path, data)
    assert result.verdict is Verdict.ERROR
    assert any(words in e for e in result.errors), result.errors


def test_a_template_key_given_twice_is_judged_both_times(tmp_path):
    result = _scan(tmp_path, gguf([*BASE, ("tokenizer.chat_template", 8, CHATML),
                                   ("tokenizer.chat_template", 8, ESCAPE)]))
    assert result.verdict is Verdict.DANGEROUS
