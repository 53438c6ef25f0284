"""How a job's ranks start: spawned locally by the job (on SLURM they join as tasks: ``sweepbench.slurm.tasks``)."""
