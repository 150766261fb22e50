"""The vetting results collector: an opt-in HTTP service that keeps node results across jobs.

``hpcml vet run --report-to URL`` posts a run's report (``client.send``); ``hpcml vet serve``
validates (``schema``), stores (``store``: SQLite or PostgreSQL, chosen by URL) and answers
a node's history, the nodes failing most and a job's results (``server``).
"""
