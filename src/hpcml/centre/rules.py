"""Rules catalog: which repeated results make the node handler drain a node, and when it
may resume it.

A YAML file, validated like protocols (one-line errors naming file, line and key, exit 2
before anything acts). A rule counts the matching results of one check on one node
within a time window; at ``count`` it drains the node with a reason that starts with
``hpcml:``, which is how the handler later recognises its own drains. ``resume_after``
says how many passes of that same check after the drain bring the node back; without it
only an operator resumes the node.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from hpcml.files import ConfigLoader, line_map, load_yaml_with_nodes, read_config, validation_problem
from hpcml.unit_fields import Fraction, Seconds

DEFAULT_RULES = Path(__file__).parent / "data" / "rules-default.yaml"
REASON_PREFIX = "hpcml:"
OUTCOMES = ("pass", "warn", "fail", "error", "skipped")
PLACEHOLDERS = {"rule": "r", "node": "n1", "check": "c", "type": "t", "outcome": "fail",
                "count": 3, "window": "24 h"}


def fmt_window(seconds: float) -> str:
    """Seconds back to the short form people write in the file ("24 h", "30 min")."""
    for unit, scale in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= scale * (2 if unit == "d" else 1) and seconds % scale == 0:   # 24 h stays 24 h
            return f"{seconds / scale:g} {unit}"
    return f"{seconds:g} s"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Match(_Strict):
    """Which results count: check name and type are shell globs. With ``job`` the rule
    counts jobs instead: those whose summary named the node in one of these roles
    (``hpcml run`` summaries in the collector), each job once."""

    check: str = "*"
    type: str = "*"
    outcome: list[Literal["pass", "warn", "fail", "error", "skipped"]] = ["fail", "error"]
    job: list[Literal["straggler", "culprit", "lost", "excluded", "crashed"]] | None = None
    #: with ``job``: the counted jobs must be of at least this many users (default 1: one
    #: user, or one user's buggy code, should not drain a node alone: set 2 or more). On a
    #: check rule: users' own vetting reports of their jobs count too, from at least this
    #: many users; without it only the node's own evidence counts (root's or SlurmUser's
    #: report made on the node, a trusted token)
    users: Annotated[int, Field(ge=1)] | None = None

    @field_validator("outcome", "job", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        if v == []:
            raise ValueError("name at least one")
        return [v] if isinstance(v, str) else v

    def matches(self, check: str, type_: str, outcome: str, from_job: bool = False) -> bool:
        if from_job != (self.job is not None):   # job rules count jobs, the others results
            return False
        if self.job is not None:
            return type_ in self.job
        return (outcome in self.outcome and fnmatchcase(check, self.check)
                and fnmatchcase(type_, self.type))


class ResumeAfter(_Strict):
    passes: int = Field(1, ge=1)


class Rule(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    match: Match = Match()
    count: int = Field(ge=1)
    window: Seconds = Field(gt=0)
    action: Literal["drain"] = "drain"
    reason: str = "hpcml: {check} {outcome} {count}x in {window}"
    resume_after: ResumeAfter | None = None
    #: the precision below which the centre report calls the rule untrusted (its drains
    #: measured against what else saw the node fail, ``hpcml.centre.precision``)
    min_precision: Fraction | None = None

    @property
    def evidence(self) -> dict:
        """What ``centre.precision.rules`` needs of it: which results it counts (its own
        evidence confirms nothing: any check its globs match, whatever the outcome), whether it
        counts jobs, its floor."""
        match = self.match

        def matches(typ: str, check: str) -> bool:
            return match.job is None and fnmatchcase(check, match.check) and fnmatchcase(typ, match.type)
        return {"matches": matches, "jobs": match.job is not None, "floor": self.min_precision}

    @model_validator(mode="after")
    def _job_rules_stay(self) -> Rule:
        if self.match.job is not None and self.resume_after is not None:
            raise ValueError("resume_after: a rule on job outcomes has no check that can pass again; "
                             "leave it out (an operator resumes the node after repairing it)")
        return self

    @field_validator("reason")
    @classmethod
    def _template(cls, v: str) -> str:
        try:
            v.format(**PLACEHOLDERS)
        except KeyError as exc:
            raise ValueError(f"unknown placeholder {{{exc.args[0]}}} (known: "
                             + ", ".join(f"{{{k}}}" for k in PLACEHOLDERS) + ")") from None
        except (ValueError, IndexError) as exc:
            raise ValueError(f"not a valid reason template: {exc}") from None
        v = " ".join(v.split())
        return v if v.startswith(REASON_PREFIX) else f"{REASON_PREFIX} {v}"

    def render_reason(self, **values) -> str:
        text = self.reason.format(**{**PLACEHOLDERS, "rule": self.name,
                                     "window": fmt_window(self.window), **values})
        return " ".join(text.split())


class Catalog(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    max_drain_fraction: Fraction = Field(0.1, ge=0, le=1)
    #: the rolling window ``max_drain_fraction`` holds over, across handler runs
    drain_window: Seconds = Field(86400.0, gt=0)
    min_nodes_kept: int = Field(0, ge=0)
    rules: list[Rule] = Field(min_length=1)
    _source: str = PrivateAttr("<rules>")

    @property
    def source(self) -> str:
        return self._source

    def rule(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.name == name), None)

    @property
    def longest_window(self) -> float:
        return max(r.window for r in self.rules)


def load(path: str | Path) -> Catalog:
    """Read and validate a rules file; raise ``UsageError`` on the first problem."""
    return loads(read_config(path), str(path))


def loads(text: str, source: str = "<rules>") -> Catalog:
    data, node = load_yaml_with_nodes(text, source)
    ld = ConfigLoader(source, line_map(node) if node is not None else {})
    if not isinstance(data, dict):
        raise ld.error((), "expected a mapping with 'name' and 'rules' at the top")
    try:
        catalog = Catalog(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ld.error(tuple(err["loc"]), validation_problem(err)) from None
    names = [r.name for r in catalog.rules]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ld.error(("rules", i, "name"), f"duplicate rule name '{name}'")
    catalog._source = source
    return catalog
