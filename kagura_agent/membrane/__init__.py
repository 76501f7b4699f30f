"""The membrane: what crosses between the host and the agent container."""
