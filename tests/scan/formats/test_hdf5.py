"""HDF5 and Keras .h5 (issue 47): recognised, never ``safe``; a Lambda layer, or a config
naming a module outside Keras, is what loading would run."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from hpcml.scan.loader import UnsafeFileError, safe_load
from hpcml.scan.model import Verdict
from tests.scan.formats.hdf5files import LAMBDA_CONFIG, PLAIN_CONFIG, keras_h5
from tests.scan.formats.scanning import names, scan_written


def _scan(tmp_path: Path, data: bytes, name: str = "model.h5"):
    return scan_written(tmp_path, data, name)



def test_keras_h5_without_code_is_not_scanned_never_safe(tmp_path):
    result = _scan(tmp_path, keras_h5(PLAIN_CONFIG))
    assert result.format == "keras-h5" and result.scanned
    assert result.verdict is Verdict.NOT_SCANNED, (result.findings, result.errors)
    assert names(result, Verdict.NOT_SCANNED) == ["HDF5 weights"]


def test_plain_hdf5_is_not_scanned(tmp_path):
    result = _scan(tmp_path, keras_h5(None), name="data.bin")
    assert (result.format, result.verdict) == ("hdf5", Verdict.NOT_SCANNED)
    assert result.errors == []


def test_lambda_layer_is_dangerous_and_named(tmp_path):
    result = _scan(tmp_path, keras_h5(LAMBDA_CONFIG))
    assert result.verdict is Verdict.DANGEROUS
    lam = [f for f in result.findings if f.verdict is Verdict.DANGEROUS]
    assert [f.name for f in lam] == ["keras Lambda 'lambda'"]
    assert lam[0].location.offset is not None and lam[0].location.offset >= 0x800
    with pytest.raises(UnsafeFileError) as info:
        safe_load(tmp_path / "model.h5")
    assert info.value.exit_code == 6


@pytest.mark.parametrize("layer", [
    {"class_name": "Lambda", "config": {"name": "hidden"}},                              # Keras 2
    {"module": "keras.layers", "class_name": "Lambda", "config": {                         # Keras 3
        "name": "hidden", "function": {"class_name": "__lambda__", "config": {"code": "4wEA"}}}},
])
def test_lambda_nested_in_a_wrapper_is_found(tmp_path, layer):
    config = {"class_name": "Functional", "config": {"layers": [
        {"class_name": "TimeDistributed", "config": {"name": "td", "layer": layer}}]}}
    result = _scan(tmp_path, keras_h5(config))
    assert "keras Lambda 'hidden'" in names(result, Verdict.DANGEROUS)


def test_escaped_class_name_is_still_a_lambda(tmp_path):
    """JSON escapes decode before Keras looks at the name; a text search alone misses them."""
    raw = b'{"class_name": "Sequential", "config": {"layers": [{"class_name": "\\u004cambda", "config": {}}]}}'
    result = _scan(tmp_path, keras_h5(raw=raw))
    assert names(result, Verdict.DANGEROUS) == ["keras Lambda"]


def test_lambda_in_json_too_broken_to_parse_is_still_reported(tmp_path):
    raw = b'{"class_name": "Sequential", "config": {"layers": [{"class_name": "Lambda", "config": {'
    result = _scan(tmp_path, keras_h5(raw=raw))
    assert result.verdict is Verdict.DANGEROUS


@pytest.mark.parametrize("module, name, verdict", [
    ("os", "system", Verdict.DANGEROUS),
    ("mylab.layers", "Gate", Verdict.UNKNOWN),
])
def test_config_naming_a_module_outside_keras_is_judged_by_the_policy(tmp_path, module, name, verdict):
    obj = ({"module": module, "class_name": "function", "config": name, "registered_name": "function"}
           if name.islower() else {"module": module, "class_name": name, "config": {"name": "g"}})
    config = {"module": "keras", "class_name": "Sequential", "config": {"layers": [
        {"module": "keras.layers", "class_name": "Dense", "config": {"name": "d", "activation": obj}}]}}
    result = _scan(tmp_path, keras_h5(config))
    assert result.verdict is verdict
    assert f"{module}.{name}" in names(result, verdict)


def test_keras_own_modules_are_not_findings(tmp_path):
    config = {"module": "keras", "class_name": "Sequential", "config": {"layers": [
        {"module": "keras.layers", "class_name": "Dense", "config": {"name": "d"}, "registered_name": None}]}}
    assert _scan(tmp_path, keras_h5(config)).verdict is Verdict.NOT_SCANNED


def test_tfoplambda_that_writes_files_is_dangerous(tmp_path):
    config = {"class_name": "Functional", "config": {"layers": [
        {"class_name": "TFOpLambda", "config": {"name": "tf.io.write_file", "function": "io.write_file"}},
        {"class_name": "TFOpLambda", "config": {"name": "tf.math.add", "function": "math.add"}}]}}
    result = _scan(tmp_path, keras_h5(config))
    assert names(result, Verdict.DANGEROUS) == ["keras TFOpLambda 'tf.io.write_file' calls tf.io.write_file"]


def test_user_block_does_not_hide_the_file(tmp_path):
    """HDF5 allows a user block: h5py and Keras open the file with its signature at 512."""
    result = _scan(tmp_path, keras_h5(LAMBDA_CONFIG, user_block=512), name="model.bin")
    assert result.verdict is Verdict.DANGEROUS, (result.format, result.findings, result.errors)
    assert any("512-byte user block" in n for n in result.notes)


def test_superblock_version_2_is_read(tmp_path):
    assert _scan(tmp_path, keras_h5(PLAIN_CONFIG, version=2)).verdict is Verdict.NOT_SCANNED


@pytest.mark.parametrize("data, words", [
    (keras_h5(PLAIN_CONFIG, eof_extra=4096), "truncated"),
    (keras_h5(PLAIN_CONFIG)[:12], "cut short"),
    (keras_h5(PLAIN_CONFIG, version=7), "superblock version 7"),
])
def test_malformed_hdf5_is_an_error(tmp_path, data, words):
    result = _scan(tmp_path, data)
    assert result.verdict is Verdict.ERROR
    assert any(words in e for e in result.errors), result.errors


def test_large_weights_are_streamed_and_a_late_config_still_found(tmp_path):
    """The config can sit after megabytes of datasets (attributes written last)."""
    data = bytearray(keras_h5(None))
    data += bytes(range(256)) * (3 * 4096 + 7)                        # 3 MiB of "weights"
    data += json.dumps(LAMBDA_CONFIG).encode()
    data[40:48] = len(data).to_bytes(8, "little")                      # the superblock's end of file
    assert _scan(tmp_path, bytes(data)).verdict is Verdict.DANGEROUS


def _keras_v3(config: dict) -> bytes:
    """A Keras 3 ``model.save("m.keras")``: a stored zip of metadata.json, config.json and
    model.weights.h5 (HDF5)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("metadata.json", json.dumps({"keras_version": "3.3.3", "date_saved": "2024-05-01@10:00:00"}))
        zf.writestr("config.json", json.dumps(config))
        zf.writestr("model.weights.h5", keras_h5(None))
    return buf.getvalue()


KERAS3 = {"module": "keras", "class_name": "Sequential", "config": {"name": "sequential", "layers": [
    {"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": [None, 4], "name": "input"},
     "registered_name": None},
    {"module": "keras.layers", "class_name": "Dense", "config": {"name": "dense", "units": 2},
     "registered_name": None, "build_config": {"input_shape": [None, 4]}}]},
    "registered_name": None, "build_config": {"input_shape": [None, 4]}}


def test_keras_v3_archive_is_not_scanned(tmp_path):
    result = _scan(tmp_path, _keras_v3(KERAS3), name="model.keras")
    assert (result.format, result.verdict) == ("keras", Verdict.NOT_SCANNED), (result.findings, result.errors)
    assert {f.location.member for f in result.findings} == {"", "model.weights.h5"}


def test_keras_v3_lambda_in_config_json_is_dangerous(tmp_path):
    config = json.loads(json.dumps(KERAS3))
    config["config"]["layers"].append(
        {"module": "keras.layers", "class_name": "Lambda", "registered_name": None, "config": {
            "name": "lambda", "function": {"class_name": "__lambda__", "config": {
                "code": "4wEAAAAAAAAAAAAAAAEAAAACAAAAQwAAAHMIAAAAdACgAaEAUwApAU4p", "defaults": None,
                "closure": None}}}})
    result = _scan(tmp_path, _keras_v3(config), name="model.keras")
    dangerous = [f for f in result.findings if f.verdict is Verdict.DANGEROUS]
    assert [(f.name, f.location.member) for f in dangerous] == [("keras Lambda 'lambda'", "config.json")]


def test_zip_with_an_unrelated_config_json_is_not_keras(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("config.json", json.dumps({"model_type": "bert", "hidden_size": 768}))
    result = _scan(tmp_path, buf.getvalue(), name="bundle.zip")
    assert (result.format, result.verdict) == ("zip", Verdict.SAFE)
