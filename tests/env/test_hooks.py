"""Site hooks file (hpcml.env.site) and hook annotations as data (hpcml.env.hooks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcml.env.hooks import apply_hooks, enabled_hooks, runtime_options
from hpcml.env.model import Environment, Mount
from hpcml.env.site import SITE_ENV_VAR, default_site, load_site, parse_site
from hpcml.errors import UsageError

SITE = """\
site: test
hooks:
  com.hooks.cxi:
    mounts: [/opt/fab:/opt/fab:ro]
    env: {FI_PROVIDER: cxi, SHARED: from-cxi}
    devices: [hpe.com/cxi=all]
  com.hooks.aws_ofi_nccl:
    implies: [com.hooks.cxi]
    env: {NCCL_CROSS_NIC: "1", SHARED: from-nccl}
    default_variant: cuda12
    variants:
      cuda12: {cuda: 12, mounts: [/opt/ofi12:/opt/ofi:ro]}
      cuda13: {cuda: 13, mounts: [/opt/ofi13:/opt/ofi:ro], options: {podman: [--x13]}}
  com.hooks.nvidia_cuda_mps:
    mounts: [/run/mps:/run/mps]
    options: {podman: [--ipc=host]}
"""


@pytest.fixture
def site():
    return parse_site(SITE, "test-site.yaml")


def env_with(**annotations: str) -> Environment:
    return Environment(image="/img", annotations={k.replace("__", "."): v for k, v in annotations.items()})


def test_default_site_describes_the_known_hooks():
    s = default_site()
    assert {"com.hooks.cxi", "com.hooks.aws_ofi_nccl", "com.hooks.ssh", "com.hooks.nvidia_cuda_mps"} <= set(s.hooks)
    variants = s.hooks["com.hooks.aws_ofi_nccl"].variants
    assert set(variants) == {"cuda12", "cuda13", "cuda-dl", "rocm5", "rocm6"}
    assert variants["cuda13"].cuda == 13 and variants["rocm6"].rocm == 6
    assert "example" in s.name


def test_cxi_adds_mounts_env_devices_and_edf_env_wins(site):
    env = Environment(image="/img", env={"FI_PROVIDER": "tcp"}, mounts=[Mount("/data", "/data")],
                      annotations={"com.hooks.cxi.enabled": "true"})
    new, warnings = apply_hooks(env, site)
    assert warnings == []
    assert new.env == {"FI_PROVIDER": "tcp", "SHARED": "from-cxi"}
    assert new.mounts == [Mount("/data", "/data"), Mount("/opt/fab", "/opt/fab", ("ro",))]
    assert new.devices == ["hpe.com/cxi=all"]
    assert new.origin["env.SHARED"].startswith("site hook com.hooks.cxi")
    assert "env.FI_PROVIDER" not in new.origin
    # the input is not modified
    assert env.env == {"FI_PROVIDER": "tcp"} and len(env.mounts) == 1 and env.devices == []


def test_nccl_variant_implies_cxi_and_earlier_hook_wins(site):
    env = env_with(com__hooks__aws_ofi_nccl__enabled="true", com__hooks__aws_ofi_nccl__variant="cuda13")
    new, warnings = apply_hooks(env, site)
    assert warnings == []
    assert Mount("/opt/ofi13", "/opt/ofi", ("ro",)) in new.mounts
    assert Mount("/opt/ofi12", "/opt/ofi", ("ro",)) not in new.mounts
    assert Mount("/opt/fab", "/opt/fab", ("ro",)) in new.mounts          # implied cxi
    assert new.env["FI_PROVIDER"] == "cxi" and new.env["SHARED"] == "from-nccl"
    assert runtime_options(env, site, "podman") == ["--x13"]


def test_default_variant_used_when_none_given(site):
    new, warnings = apply_hooks(env_with(com__hooks__aws_ofi_nccl__enabled="1"), site)
    assert warnings == [] and Mount("/opt/ofi12", "/opt/ofi", ("ro",)) in new.mounts


def test_unconfigured_variant_warns_and_is_not_applied(site):
    env = env_with(com__hooks__aws_ofi_nccl__enabled="true", com__hooks__aws_ofi_nccl__variant="rocm6")
    new, warnings = apply_hooks(env, site)
    assert len(warnings) == 1 and "'rocm6' is not configured" in warnings[0]
    assert warnings[0].startswith("annotations.com.hooks.aws_ofi_nccl.variant:")
    assert all(m.target != "/opt/ofi" for m in new.mounts) and "NCCL_CROSS_NIC" not in new.env


def test_disabled_hook_is_not_applied(site):
    new, warnings = apply_hooks(env_with(com__hooks__cxi__enabled="false"), site)
    assert warnings == [] and new.mounts == [] and enabled_hooks(new.annotations) == []


def test_hook_not_on_this_site_warns_with_consequence():
    bare = parse_site("hooks: {}", "bare.yaml")
    new, warnings = apply_hooks(env_with(com__hooks__cxi__enabled="true", com__hooks__ssh__enabled="true"), bare)
    assert warnings[0].startswith("annotations.com.hooks.cxi.enabled: this site's hooks file has no cxi entry: "
                                  "the container gets no Slingshot libfabric; NCCL will fall back to TCP")
    assert "no ssh entry" in warnings[1] and len(warnings) == 2
    assert new.mounts == [] and new.env == {}


def test_unknown_hook_annotations_warn_others_do_not(site):
    env = env_with(com__hooks__frobnicate__enabled="true", com__hooks__ssh__prot="22",
                   com__pyxis__entrypoint_log="true", com__hpcml__venv="/v", org__example__x="1")
    _, warnings = apply_hooks(env, site)
    assert len(warnings) == 2
    assert warnings[0].startswith("annotations.com.hooks.frobnicate.enabled: unknown hook 'frobnicate'")
    assert warnings[1].startswith("annotations.com.hooks.ssh.prot: unknown key 'prot'")


def test_edf_mount_target_wins_over_hook(site):
    env = Environment(image="/img", mounts=[Mount("/mine", "/run/mps")],
                      annotations={"com.hooks.nvidia_cuda_mps.enabled": "true"})
    new, _ = apply_hooks(env, site)
    assert new.mounts == [Mount("/mine", "/run/mps")]
    assert runtime_options(env, site, "podman") == ["--ipc=host"]
    assert runtime_options(env, site, "pyxis") == []


@pytest.mark.parametrize("text, key, words", [
    ("hooks: {com.hooks.cxi: {env: [1]}}", "hooks.com.hooks.cxi.env", "found a list"),
    ("hooks: {com.hooks.cxi: {env: {'C;touch x;D': v}}}", "hooks.com.hooks.cxi.env", "not a variable name"),
    ("hooks: {com.hooks.x: {variants: {a: {env: {\"A\\nB\": v}}}}}", "hooks.com.hooks.x.variants.a.env",
     "not a variable name"),
    ("hooks: {com.hooks.cxi: {mounts: ['/a:b']}}", "hooks.com.hooks.cxi.mounts", "absolute"),
    ("hooks: {com.hooks.cxi: {mounts: ['a:/b']}}", "hooks.com.hooks.cxi.mounts", "must be absolute"),
    ("hooks: {com.hooks.cxi: {mountz: []}}", "hooks.com.hooks.cxi.mountz", "unknown key"),
    ("hooks: {cxi: {}}", "hooks", "com.hooks.NAME"),
    ("hooks: {com.hooks.x: {implies: [com.hooks.y]}}", "hooks", "no entry"),
    ("hooks: {com.hooks.x: {variants: {a: {cuda: x}}}}", "hooks.com.hooks.x.variants.a.cuda", "found str 'x'"),
    ("hooks: {com.hooks.x: {default_variant: b, variants: {a: {}}}}", "hooks", "default_variant 'b'"),
    ("hooks: {com.hooks.x: {options: {docker: []}}}", "hooks.com.hooks.x.options", "found 'docker'"),
    ("sites: x", "sites", "unknown key"),
])
def test_bad_site_file_is_one_line_usage_error(tmp_path: Path, text, key, words):
    path = tmp_path / "site.yaml"
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        load_site(path)
    err = info.value
    assert err.exit_code == 2 and err.file == str(path) and err.key == key
    assert words in str(err) and "\n" not in str(err)


def test_yaml_syntax_error_names_line(tmp_path: Path):
    path = tmp_path / "site.yaml"
    path.write_text("hooks:\n  com.hooks.cxi: [\n")
    with pytest.raises(UsageError) as info:
        load_site(path)
    assert info.value.line is not None and str(path) in str(info.value)


def test_site_lookup_order(tmp_path: Path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("site: A")
    b.write_text("site: B")
    assert load_site(a, environ={SITE_ENV_VAR: str(b)}).name == "A"
    assert load_site(None, environ={SITE_ENV_VAR: str(b)}).name == "B"
    assert "example" in load_site(None, environ={}).name
    with pytest.raises(UsageError, match=r"HPCML_ENV_SITE"):
        load_site(None, environ={SITE_ENV_VAR: str(tmp_path / "missing.yaml")})
