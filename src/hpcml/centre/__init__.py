"""The centre: what a site runs for everyone, across jobs. Its commands are ``hpcml centre
serve | handle | rules | report`` (``cli``; ``hpcml vet serve | handle | rules | fleet-report``
are their aliases).

- ``collector``: the results collector, an opt-in HTTP service (``server``) that validates
  (``schema``), proves (``proof``: who sent it, by MUNGE and Slurm's records) and stores
  (``store``: SQLite or PostgreSQL, chosen by URL) vetting reports and job summaries;
- ``client``: the one way anything sends to it: ``hpcml vet --report-to`` and the prolog a
  vetting report, ``hpcml run --collector`` and ``hpcml report --send`` a job summary;
- ``summaries`` (the collector's reading of ``hpcml.job.summary/1``, the model itself being
  ``hpcml.jobmodel``'s) and ``jobstore`` (their tables, proof columns and queries);
- ``handler`` with ``rules`` and ``sources``: the node handler that drains and resumes nodes
  from past vetting results and jobs' node events;
- ``report``: the centre's report over jobs and vetting results.

Below ``vet`` and ``run``, which both send through ``client``: nothing here imports either.
The tag of a vetting report, which the collector and the handler check, is
``hpcml.schemas.VET_REPORT`` for that reason.
"""
