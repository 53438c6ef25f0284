"""Sweeps: tags, the sweeper (validate, resume, dry run, launch), aggregation and the summary."""
