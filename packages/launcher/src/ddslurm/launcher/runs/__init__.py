"""A run once submitted: finding it, its records and status, following, steering, collecting, its logs and
its workflow's next stage."""
