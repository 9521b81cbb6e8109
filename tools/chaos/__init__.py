"""A randomized, seeded fault campaign on the real local Slurm cluster (issue 17): ``python -m tools.chaos``."""
