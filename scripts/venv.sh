# Sourced by scripts/test and scripts/example: a virtual environment built from $PY for this
# checkout, reused while a stamp of its inputs is unchanged, rebuilt from scratch otherwise.
# ensure_venv VENV SPEC STAMP_INPUTS... : installs "-e SPEC" and torch's pinned CPU build.

as_root() { [ "$(id -u)" = 0 ]; }
apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=120 \
    install --no-install-recommends "$@" >/dev/null \
  || { apt-get -q update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get -q -y \
         -o DPkg::Lock::Timeout=120 install --no-install-recommends "$@" >/dev/null; }
}

# The stamp of a venv's inputs: the files given, and the base interpreter behind $PY (its
# version and installation). Not $PY's own path: with another venv active, python3 is that
# venv's python, which builds the same venv (venv uses the base interpreter): no rebuild.
venv_stamp() {
  { cat pyproject.toml scripts/venv.sh "$@"; "$PY" -c 'import sys; print(sys.version, sys.base_prefix)'; } \
    | sha256sum | cut -c1-16
}

# venv_install PYTHON SPEC [PIP_OPTIONS...]: "-e SPEC" and the pinned CPU torch in one resolver
# call. Installed after the project, the project's "torch>=2.1" first pulled the newest CUDA
# build (3.2 GB of nvidia-* wheels and triton), which the pin then replaced alone: a 5.2 GB venv.
venv_install() {
  local py=$1 spec=$2; shift 2
  "$py" -m pip -q --disable-pip-version-check install "$@" -e "$spec" "torch==2.13.0"
}

ensure_venv() {
  local venv=$1 spec=$2; shift 2
  local who; who=$(basename "$0")
  # Debian splits venv/ensurepip out of python3 (package python3.X-venv).
  if ! "$PY" -c "import ensurepip, venv" 2>/dev/null; then
    local ver; ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    if as_root; then
      apt_install "python$ver-venv" || apt_install python3-venv
    else
      echo "scripts/$who: $PY cannot create a virtual environment; as root: apt install python$ver-venv" >&2
      exit 2
    fi
  fi
  local stamp; stamp=$(venv_stamp "$@")
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.hpcml-stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "scripts/$who: building the venv $venv (inputs changed or missing)" >&2
    "$PY" -m venv --clear "$venv"
    local log="$venv/.hpcml-install.log"
    venv_install "$venv/bin/python" "$spec" >"$log" 2>&1 \
      || { tail -n 30 "$log" >&2; echo "scripts/$who: installing into $venv failed (log: $log)" >&2; exit 1; }
    echo "$stamp" > "$venv/.hpcml-stamp"
  fi
}
