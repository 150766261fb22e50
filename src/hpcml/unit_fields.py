"""The units of ``hpcml.units`` as pydantic field types: ``min_free: Bytes = "1 GB"``.

Apart from ``hpcml.units`` so that what only parses or formats a quantity (a node's vet
worker, a report) does not import pydantic.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator

from hpcml.units import parse_bytes, parse_flops, parse_fraction, parse_rate, parse_seconds

Bytes = Annotated[float, BeforeValidator(parse_bytes)]
Rate = Annotated[float, BeforeValidator(parse_rate)]
Flops = Annotated[float, BeforeValidator(parse_flops)]
Seconds = Annotated[float, BeforeValidator(parse_seconds)]
Fraction = Annotated[float, BeforeValidator(parse_fraction)]
