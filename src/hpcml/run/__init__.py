"""``hpcml run``: vet, launch, record and report a training job in one command.

Inside a Slurm allocation it vets the nodes (``--vet``), launches one task per slot with
srun on the good ones, sets torch.distributed's rendezvous for every task, wraps each task
in ``hpcml env run`` (``--env``) and ``hpcml observe record``, and leaves one job
directory that ``hpcml report`` turns into one report. Outside Slurm it runs local tasks
the same way. Layout of the job directory: ``hpcml.run.jobdir``.
"""
