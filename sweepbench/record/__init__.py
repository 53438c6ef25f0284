"""What a job leaves behind: metrics.json, env.json and a wandb run."""

METRICS_FILE = "metrics.json"  # the job's result (sweepbench.record.recorder writes it)
ENV_FILE = "env.json"  # where and with what it ran (sweepbench.record.env)
ROUNDS_DIR = "rounds"  # a job run N times (sweep.repeats): round r is a whole job directory <tag>/rounds/<r>/
