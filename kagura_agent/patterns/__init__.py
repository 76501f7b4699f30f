"""Learning patterns on top of a MemoryStore: checkpoint/resume, failure learning, cost
history, sub-agent dispatch and erasure. Each module is small and called by the planner
(facts) or by apply (after a run, per step)."""
