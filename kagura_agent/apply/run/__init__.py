"""The run's sequence: refusals, the lock, the run row, leases, the container (or the host)
run, the brain's turn, verify; executor.apply_plan is where it starts."""
