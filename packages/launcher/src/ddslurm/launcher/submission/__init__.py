"""The submission pipeline: the inputs read once, validated and compiled, the arrays planned within the
scheduler's limits, the run directory written and the arrays submitted; the dry run and the bill."""
