"""apply: execute a launch plan exactly as shown, in five roles, in order of time.

run/        the run's sequence: refusals and freshness, then executor.py (apply_plan),
            the run one chain of steps (steps.py: leases, proxy, container, watches)
            around the brain's turn and verify (container.py, or hostrun.py)
guards/     what watches the run while it goes on and stops it: the disk budget,
            the hijack tripwires, model calls counted at the proxy, a dead parent
midrun/     what the brain asks for while it runs: grants and budget extensions
            (amended plans), renewed injected credentials, sub-agents, host memory
aftercare/  the project root once the run's last container is gone: one function
            (root.tend) for a run's own end and for the sweep of a dead run
records/    what the run shows and keeps: the live view, its journal, the runs table
            (lock, dead-run sweep), incidents, the record of the result
"""
