"""The workspace's facts: read for the planner's cost model, measured by finished runs and by ``ddslurm tune``."""
