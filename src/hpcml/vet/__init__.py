"""Node vetting and early abort: protocol -> checks on every node -> verdict -> exclude list.

Also the prolog mode (``prolog``) and the culprit search (``culprit``). What happens to the
results across jobs (the collector, the node handler, the centre's report) is
``hpcml.centre``'s: ``vet`` sends its report through ``hpcml.centre.client``.
"""
