"""The centre's side of jobs: what each job's summary says (``summaries``: the collector's
reading of ``hpcml.job.summary/1``, the model itself being ``hpcml.jobmodel``'s), where the
collector keeps them (``jobstore``: tables, proof columns and the centre's queries), and the
report over them (``report``: ``hpcml vet fleet-report``).

Its own package, beside ``vet``: vetting decides about nodes from vetting results; the centre
joins what jobs say. The collector (``vet.fleet.collector``) serves both and imports this
package; nothing here imports ``vet`` or ``run``.
"""
