"""Root aftercare: the project root once a run's last container is gone. root.tend is the
one function for a run's own end and for the sweep of a dead run."""
