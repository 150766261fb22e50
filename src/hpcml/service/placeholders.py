"""Filling a blueprint's ``${...}`` placeholders for one place it runs (see ``blueprint``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcml.service.blueprint import PLACEHOLDER, Blueprint


@dataclass(frozen=True)
class Place:
    """What the placeholders mean where the service runs."""

    host: str                                     # the address to bind
    ports: dict[str, int]                         # port name -> number
    volumes: dict[str, str]                       # volume name -> directory
    files: dict[str, str]                         # files name -> directory
    services: dict[str, dict[str, str]] = field(default_factory=dict)   # dependency -> port name -> URL


@dataclass(frozen=True)
class Expanded:
    command: list[str]
    env: dict[str, str]
    files: dict[str, dict[str, str]]              # files name -> file name -> text


def expand(bp: Blueprint, place: Place) -> Expanded:
    """The command, environment and files of ``bp`` with every placeholder filled."""
    options: dict[str, str] = {}

    def sub(text: str) -> str:
        def one(m) -> str:
            kind, a, b = m.groups()
            if kind == "host":
                return place.host
            if kind == "port":
                return str(place.ports[a])
            if kind == "volumes":
                return place.volumes[a]
            if kind == "files":
                return place.files[a]
            if kind == "options":
                return options[a]
            return place.services[a][b]
        return PLACEHOLDER.sub(one, text)

    for key, value in bp.options.items():        # an option may use the options above it (validated)
        options[key] = sub(value)
    return Expanded(command=[sub(c) for c in bp.command], env={k: sub(v) for k, v in bp.env.items()},
                    files={f.name: {n: sub(t) for n, t in f.content.items()} for f in bp.files})
