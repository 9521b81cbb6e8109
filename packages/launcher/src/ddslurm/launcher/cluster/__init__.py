"""The cluster and the submit host: the Slurm client, the commands it runs, the profile's ``python_env`` and
the engine host that asks it about Data Designer, and ``doctor``'s checks."""
