"""Mid-run requests: what the brain asks for while it runs (capability grants and budget
extensions as amended plans, renewed injected credentials, sub-agents, host memory)."""
