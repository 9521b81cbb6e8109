"""The ``ddslurm`` commands over the API and the services: the session, the output and the console."""
