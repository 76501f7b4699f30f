"""kagura-agent: plan, review and apply memory-backed agent runs behind a hardened membrane."""

__version__ = "0.1.0"
