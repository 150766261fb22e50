"""The straggler model's thresholds (``hpcml.observe.stragglers``), apart from its numpy code.

The launcher's live watch needs these at its import, and numpy only once ranks report
steps: kept here, the watch starts without numpy, whose import (~0.1 s of CPU) would
otherwise compete with the task wrappers' and ranks' own start-up on a shared node.
"""

MIN_STEPS = 30
CHRONIC = 0.10           # slower than the step's median by more than this: a slow step
MIN_SECONDS = 60.0
BIMODAL_GAP = 1.25       # the slower group's median score over the faster group's, at least
BIMODAL_SHARE = 0.25     # of the ranks in each group, at least
#: a slow rank whose threads waited for a CPU this many seconds per second (the scheduler's run
#: delay), or whose node lost this share of its CPU time to the hypervisor: contention, not a straggler
CONTENDED = 0.2
