"""Conformance with CSCS's own EDFs: every EDF block of CSCS's documentation
(``../shared/testdata/cscs-edf``, see its PROVENANCE.md and manifest.tsv), judged as the docs
judge it, and Sarus Suite's ``sarusctl render`` output compared by meaning.

The files are read where they are, never copied; a checkout without ``../shared`` skips this
module in one line. The rules these files exercise have their own cases in test_edf.py and
test_render.py too, so they hold for the class of input, not only for these files.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hpcml.env.edf import load
from hpcml.env.runtimes import get
from hpcml.env.runtimes.base import image_kind
from hpcml.errors import UsageError
from tests.needs import shared_testdata

DATA = shared_testdata("cscs-edf")
MANIFEST = list(csv.DictReader((DATA / "manifest.tsv").open(encoding="utf-8"), delimiter="\t"))
# the login node of the user in CSCS's examples (sarusctl render's mounts show these values)
HOST = {"HOME": "/users/amadonna", "USER": "amadonna", "PWD": "/users/amadonna",
        "SCRATCH": "/capstor/scratch/cscs/amadonna", "PATH": "/usr/local/bin:/usr/bin:/bin"}
REFUSED = ("invalid", "invalid-toml (docs defect)", "snippet (not TOML)", "snippet ([annotations] lines)")


def rows(*verdicts: str) -> list[str]:
    return [r["file"] for r in MANIFEST if r["expected_per_cscs_docs"] in verdicts]


def edf(name: str) -> str:
    return str(DATA / "edf" / name)


def one_line_refusal(path: str, **kw) -> UsageError:
    with pytest.raises(UsageError) as info:
        load(path, **kw)
    err = info.value
    assert "\n" not in str(err) and Path(path).name in str(err) and "Traceback" not in str(err)
    return err


def test_the_manifest_is_what_this_module_expects():
    assert len(rows("valid")) == 28 and len(MANIFEST) == 69
    assert {r["expected_per_cscs_docs"] for r in MANIFEST} >= set(REFUSED) | {"valid", "template"}


@pytest.mark.parametrize("name", rows("valid"))
def test_every_working_example_validates_and_renders(name, tmp_path):
    """The 28 full EDFs CSCS presents as working, six with pyxis's short-form mounts."""
    resolved = load(edf(name), environ=HOST, cwd=str(tmp_path))
    env = resolved.env
    assert env.image and resolved.warnings == []
    for m in env.mounts:
        assert m.source.startswith("/") and m.target.startswith("/")
    runtime = {"ref": "pyxis", "squashfs": "enroot", "dir": "bubblewrap"}[image_kind(env.image)]
    launch = get(runtime).render(env, ["true"], environ=HOST, scratch="/s")
    assert launch.argv[-1] == "true"


def test_short_form_mounts_are_the_same_path_inside(tmp_path):
    env = load(edf("access_jupyterlab-L58.toml"), environ=HOST, cwd=str(tmp_path)).env
    assert [(m.source, m.target) for m in env.mounts][:2] == [("/capstor", "/capstor"), ("/iopsstor", "/iopsstor")]
    assert env.mounts[2].target == "/users/amadonna/.local/share/jupyter"
    spec = get("pyxis").render(env, ["true"], environ=HOST).argv[2]
    assert spec.startswith("--container-mounts=/capstor:/capstor,/iopsstor:/iopsstor,")


@pytest.mark.parametrize("name", rows("valid fragment (no image)"))
def test_fragments_validate_without_an_image_and_with_the_docs_image(name, tmp_path):
    """CSCS: an EDF without image is valid (the CE then does not enter a container);
    ``validate`` wants one, so edf-derived/ adds the docs' own image example."""
    load(edf(name), environ=HOST, cwd=str(tmp_path), require_image=False)
    derived = DATA / "edf-derived" / name.replace(".toml", ".with-image.toml")
    assert load(str(derived), environ=HOST, cwd=str(tmp_path)).env.image == "library/ubuntu:24.04"


@pytest.mark.parametrize("name", rows("valid (needs base EDF common_env)", "valid (needs base EDFs)"))
def test_base_environment_examples_with_bases_given(name, tmp_path):
    (tmp_path / "common_env.toml").write_text('image = "library/ubuntu:24.04"\nmounts = ["/capstor"]\n')
    (tmp_path / "ml_pytorch_env1.toml").write_text('mounts = ["/capstor:/capstor:ro"]\n[env]\nA = "1"\n')
    env = load(edf(name), environ=dict(HOST, EDF_PATH=str(tmp_path)), cwd=str(tmp_path)).env
    assert env.image == "library/ubuntu:24.04"
    assert len(env.mounts) == 1          # the second base remounts /capstor read-only: one mount, not two
    assert env.mounts[0].flags == (("ro",) if "ml_pytorch_env1" in Path(edf(name)).read_text() else ())


def test_variable_from_host_example_needs_it_here_or_in_the_image(tmp_path):
    name = edf("ce_edf-L176.toml")
    quiet = load(name, environ=dict(HOST, VAR_FROM_HOST="nid001"), cwd=str(tmp_path), require_image=False)
    assert quiet.warnings == [] and quiet.env.env["MY_NODE"] == "nid001"
    # PATH = "${PATH}:/custom/bin" is the *container's* PATH (the image's over the host's)
    assert quiet.env.env_template["PATH"] == "${PATH}:/custom/bin" and "DEBUG" not in quiet.env.env_template
    loud = load(name, environ=HOST, cwd=str(tmp_path), require_image=False)
    assert len(loud.warnings) == 1 and "VAR_FROM_HOST is not set here" in loud.warnings[0]


@pytest.mark.parametrize("name", rows(*REFUSED))
def test_broken_examples_are_refused_in_one_line(name, tmp_path):
    err = one_line_refusal(edf(name), environ=HOST, cwd=str(tmp_path))
    if name.startswith("ce_resource-hook") and "snippet" in next(
            r["expected_per_cscs_docs"] for r in MANIFEST if r["file"] == name):
        assert err.key == "com"           # annotation lines without their [annotations] header
    else:
        assert err.line is not None       # TOML errors name the line


@pytest.mark.parametrize("path", sorted((DATA / "edf-derived").glob("pyxis_mounts-*.toml")), ids=lambda p: p.stem)
def test_pyxis_mount_tests(path, tmp_path):
    """pyxis's tests/mounts.bats as EDFs: what pyxis mounts validates (short form and
    ``unbindable+ro`` included), the path escape (``/home:../home``) is refused."""
    if "path-escape" in path.name:
        err = one_line_refusal(str(path), environ=HOST, cwd=str(tmp_path))
        assert err.key == "mounts[0]" and "absolute" in str(err)
        return
    env = load(str(path), environ=HOST, cwd=str(tmp_path)).env
    spec = get("pyxis").render(env, ["true"], environ=HOST).argv[2]
    expected_flags = {"read-only": "ro", "unbindable-ro": "unbindable+ro"}.get(path.stem.split("-", 1)[1])
    if expected_flags:
        assert spec.endswith(":" + expected_flags)
    if "short-form" in path.name:
        assert spec == "--container-mounts=/var/lib:/var/lib"
    if "cwd" in path.name:
        assert spec == f"--container-mounts={tmp_path}:/test-mnt"


@pytest.mark.parametrize("expected", sorted((DATA / "expected").glob("*.sarusctl-render.json")), ids=lambda p: p.stem)
def test_sarusctl_render_by_meaning(expected, tmp_path):
    """``sarusctl render`` is Sarus Suite's resolved EDF: the same values, key by key, with
    Sarus Suite's defaults (entrypoint on); the CE's defaults differ only there."""
    want = json.loads(expected.read_text())
    source = edf(expected.name.replace(".sarusctl-render.json", ".toml"))
    got = load(source, environ=HOST, cwd=str(tmp_path), engine="sarus-suite").to_json()
    got["mounts"] = [":".join([m["source"], m["target"], *(["+".join(m["flags"])] if m["flags"] else [])])
                     for m in got["mounts"]]
    assert {k: got[k] for k in want} == want
    ce = load(source, environ=HOST, cwd=str(tmp_path)).env
    assert ce.entrypoint is False and "entrypoint" not in ce.origin


def test_slash_form_registry_gets_enroots_hash(tmp_path):
    env = load(edf("software_alps-extended-images-L169.toml"), environ=HOST, cwd=str(tmp_path)).env
    pyxis = get("pyxis").render(env, ["true"], environ=HOST).argv
    assert pyxis[1] == "--container-image=ghcr.io#eth-cscs/alps-extended-images/ngc-pytorch:26.02-py3-alps6"
    enroot = get("enroot").render(env, ["true"], environ=HOST).prepare[0]
    assert enroot[-1] == "docker://ghcr.io#eth-cscs/alps-extended-images/ngc-pytorch:26.02-py3-alps6"
    podman = get("podman").render(env, ["true"], environ=HOST).argv
    assert "ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:26.02-py3-alps6" in podman
