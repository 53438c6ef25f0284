"""A sweep's jobs on SLURM (``hydra/launcher=slurm``): what each job asks for (``request``), its
submission as job arrays and the wait for them (``submit``, ``watch``), several jobs per allocation
(``groups``), and each job's ranks as SLURM tasks (``tasks``)."""
