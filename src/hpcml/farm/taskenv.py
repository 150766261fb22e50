"""Moved to ``hpcml.cluster.taskenv``; kept only until ``hpcml.run.launcher`` and ``hpcml.run.jobdir`` import it from there."""

from hpcml.cluster.taskenv import *  # noqa: F403
from hpcml.cluster.taskenv import FARM_JOB as FARM_JOB
from hpcml.cluster.taskenv import current as current
