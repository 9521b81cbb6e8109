"""``ddslurm init``: what it chooses from the cluster, the files it writes and where, the starter recipes."""
