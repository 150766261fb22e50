"""The protocol fields of the built-in checks, as pydantic models the launcher validates.

Kept apart from the checks so that a node's worker, which gets the values already
validated and in base units, never imports pydantic (~0.1-0.2 s of CPU on every node).
A check names its model as a string type argument (``Check["MemoryParams"]``); this
module is where ``Check.Params`` looks it up.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hpcml.unit_fields import Bytes, Flops, Fraction, Rate, Seconds


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_available: Bytes | None = None
    min_available_fraction: Fraction | None = 0.5


class LoadParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_load_per_cpu: float = 1.0


class DiskParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = "/tmp"
    min_free: Bytes = 1e9
    write_size: Bytes = 8 * 2**20
    min_write_rate: Rate | None = None


class MountsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    paths: list[str] = Field(min_length=1)
    must_be_mountpoint: bool = False
    probe_timeout: Seconds = 3.0


class EnvParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: name -> exact value, or null for "must be set, any value" (vetnode's meaning)
    expected: dict[str, str | None] = {}
    #: names that must not be set (e.g. a PYTHONPATH that shadows the image's packages)
    absent: list[str] = []


class ClockParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_skew: Seconds = 0.5


class TcpParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str
    port: int = 53
    connect_timeout: Seconds = 3.0


class ImportsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    modules: list[str] = Field(min_length=1)


class ProcessesParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: users below this uid are system daemons, not leftovers
    min_uid: int = 1000
    allowed_users: list[str] = []
    ignore_names: list[str] = []
    max_foreign: int = 0


class ComputeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(1024, ge=16, le=32768)
    repeats: int = Field(3, ge=1, le=1000)
    dtype: Literal["float32", "float64", "float16", "bfloat16"] = "float32"
    device: Literal["auto", "cpu", "gpu"] = "auto"
    min_flops: Flops | None = None
    seed: int = 1234
    #: BLAS threads on the CPU (default: the library's own); 1 makes nodes that share a host
    #: (or a noisy one) comparable
    threads: int | None = Field(None, ge=1)
