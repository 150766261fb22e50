"""``hpcml farm``: many similar tasks (sweeps, task lists) in one or several allocations,
each run to completion exactly once, resumable after any kill.

``sweep`` reads task and sweep files; ``store`` keeps the farm directory and its task list;
``claim`` is the exactly-once protocol on a shared filesystem (read its docstring);
``lease`` tells live workers from dead ones; ``worker`` runs one slot; ``agent`` starts the
slots (and, under Slurm, one agent per node); ``status`` and ``results`` read the directory.
"""
