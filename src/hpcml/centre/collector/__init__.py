"""The results collector: an opt-in HTTP service that keeps vetting results and job summaries
across jobs.

``hpcml vet run --report-to URL`` posts a run's report and ``hpcml run --collector URL`` a job's
summary (both through ``hpcml.centre.client``); ``hpcml centre serve`` validates (``schema``),
proves the sender (``proof``), stores (``store``: ``sqlite`` or ``postgres``, chosen by URL)
and answers a node's history, the nodes failing most, a job's results and the centre's report
(``server``).
"""
