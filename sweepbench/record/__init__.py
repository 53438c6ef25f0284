"""What a job leaves behind: metrics.json, env.json and a wandb run."""
