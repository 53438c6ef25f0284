"""How a job's ranks start: spawned locally by the job, or joined as SLURM tasks."""
