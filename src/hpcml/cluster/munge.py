"""MUNGE credentials: who sent something, proven the way Slurm proves it.

A credential is made by the local ``munged`` for the calling process's uid and gid, with a
payload (here: the SHA-256 digest of what it vouches for) and a time to live; any host
that shares the cluster's MUNGE key decodes it and learns the uid and gid it was made by,
and its ``munged`` refuses a credential decoded before (a replay), expired or forged.

Through ``libmunge`` (``munge_encode``/``munge_decode``, documented in munge(3)) with
ctypes, not by running the ``munge``/``unmunge`` commands: the collector decodes one
credential per summary, and a process per summary would cap its ingest (a decode through
the library is a round trip on munged's socket). libmunge ships with the cluster's munge
package; where it is missing, ``available()`` is False and callers say so.

The socket is munged's default unless given: ``$HPCML_MUNGE_SOCKET``, else the
``socket=`` of Slurm's ``AuthInfo`` (a site or a test cluster running munged elsewhere).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from functools import lru_cache

SOCKET_ENV = "HPCML_MUNGE_SOCKET"
_OPT_TTL, _OPT_ADDR4, _OPT_ENCODE_TIME, _OPT_SOCKET = 4, 5, 6, 8   # munge_opt_t (munge.h)
_EMUNGE_SOCKET, _EMUNGE_TIMEOUT = 6, 7                      # munge_err_t: munged unreachable
_EMUNGE_CRED_REPLAYED = 17
MAX_CREDENTIAL = 4096             # a credential carrying a 32-byte digest is ~200 characters


class MungeError(Exception):
    """A credential that does not prove anything (bad, expired, replayed, rewound,
    unauthorised) or, with ``transient``, a munged that could not be asked."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code

    @property
    def transient(self) -> bool:
        return self.code in (0, _EMUNGE_SOCKET, _EMUNGE_TIMEOUT)

    @property
    def replayed(self) -> bool:
        return self.code == _EMUNGE_CRED_REPLAYED


@dataclass(frozen=True)
class Decoded:
    uid: int
    gid: int
    payload: bytes
    encoded_at: int          # seconds since the epoch, munged's clock where it was made
    ttl: int
    addr: str = ""           # IPv4 address of the host whose munged made it (MUNGE_OPT_ADDR4)


@lru_cache(maxsize=1)
def _lib():
    name = ctypes.util.find_library("munge") or "libmunge.so.2"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                 ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint32),
                                 ctypes.POINTER(ctypes.c_uint32)]
    lib.munge_strerror.restype = ctypes.c_char_p
    lib.munge_strerror.argtypes = [ctypes.c_int]
    lib.munge_ctx_create.restype = ctypes.c_void_p
    lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
    lib.munge_ctx_strerror.restype = ctypes.c_char_p
    lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
    return lib


def available() -> bool:
    """libmunge can be loaded (munged may still be down: encode/decode then say so)."""
    return _lib() is not None


@lru_cache(maxsize=1)
def _libc():
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


@lru_cache(maxsize=1)
def slurm_socket() -> str | None:
    """The munged socket Slurm is configured with (``AuthInfo=socket=...``), if any."""
    from hpcml.cluster import slurm
    from hpcml.errors import SlurmError
    try:
        return config_socket(slurm.show_config())
    except SlurmError:
        return None


def config_socket(config: dict[str, str]) -> str | None:
    """The ``socket=`` of ``AuthInfo`` in Slurm's config (``slurm.show_config``), if any."""
    for part in config.get("AuthInfo", "").split(","):
        k, _, v = part.strip().partition("=")
        if k == "socket" and v:
            return v
    return None


def socket_path(explicit: str | None = None) -> str | None:
    """``explicit``, else ``$HPCML_MUNGE_SOCKET``, else Slurm's, else None (munged's default)."""
    return explicit or os.environ.get(SOCKET_ENV) or slurm_socket()


class _Ctx:
    def __init__(self, socket: str | None) -> None:
        lib = _lib()
        if lib is None:
            raise MungeError("libmunge is not installed")
        self.lib = lib
        self.ptr = lib.munge_ctx_create()
        if not self.ptr:
            raise MungeError("munge_ctx_create failed")
        if socket:
            self._socket = socket.encode()      # kept alive: libmunge copies it, but be safe
            err = lib.munge_ctx_set(ctypes.c_void_p(self.ptr), ctypes.c_int(_OPT_SOCKET),
                                    ctypes.c_char_p(self._socket))
            if err:
                self.close()
                raise MungeError(f"socket {socket}: {lib.munge_strerror(err).decode()}", err)

    def error(self, err: int) -> MungeError:
        text = self.lib.munge_ctx_strerror(ctypes.c_void_p(self.ptr)) or self.lib.munge_strerror(err)
        return MungeError(text.decode(errors="replace"), err)

    def get_int(self, opt: int, ctype) -> int:
        value = ctype(0)
        self.lib.munge_ctx_get(ctypes.c_void_p(self.ptr), ctypes.c_int(opt), ctypes.byref(value))
        return int(value.value)

    def get_addr4(self) -> str:
        """The origin address munged put in the credential (a ``struct in_addr``)."""
        value = ctypes.create_string_buffer(4)
        if self.lib.munge_ctx_get(ctypes.c_void_p(self.ptr), ctypes.c_int(_OPT_ADDR4), value):
            return ""
        import socket
        return socket.inet_ntoa(value.raw)

    def close(self) -> None:
        if self.ptr:
            self.lib.munge_ctx_destroy(ctypes.c_void_p(self.ptr))
            self.ptr = None


def encode(payload: bytes, socket: str | None = None) -> str:
    """A credential for this process's uid and gid carrying ``payload``."""
    ctx = _Ctx(socket_path(socket))
    try:
        cred = ctypes.c_char_p()
        buf = ctypes.create_string_buffer(payload, len(payload))
        err = ctx.lib.munge_encode(ctypes.byref(cred), ctypes.c_void_p(ctx.ptr), buf, len(payload))
        if err:
            raise ctx.error(err)
        try:
            return (cred.value or b"").decode("ascii")
        finally:
            _libc().free(ctypes.cast(cred, ctypes.c_void_p))
    finally:
        ctx.close()


def decode(credential: str, socket: str | None = None) -> Decoded:
    """Who made ``credential`` and what it carries; ``MungeError`` when it proves nothing
    (munged refuses a credential it has decoded before)."""
    if not isinstance(credential, str) or not credential.startswith("MUNGE:") \
            or len(credential) > MAX_CREDENTIAL or not credential.isascii():
        raise MungeError("not a MUNGE credential", 8)           # EMUNGE_BAD_CRED
    ctx = _Ctx(socket_path(socket))
    try:
        buf, n = ctypes.c_void_p(), ctypes.c_int(0)
        uid, gid = ctypes.c_uint32(0), ctypes.c_uint32(0)
        err = ctx.lib.munge_decode(credential.encode("ascii"), ctypes.c_void_p(ctx.ptr), ctypes.byref(buf),
                                   ctypes.byref(n), ctypes.byref(uid), ctypes.byref(gid))
        try:
            payload = ctypes.string_at(buf, n.value) if buf.value else b""
        finally:
            if buf.value:
                _libc().free(buf)
        if err:
            raise ctx.error(err)
        return Decoded(uid.value, gid.value, payload, ctx.get_int(_OPT_ENCODE_TIME, ctypes.c_long),
                       ctx.get_int(_OPT_TTL, ctypes.c_int), ctx.get_addr4())
    finally:
        ctx.close()
