"""Live guards: what watches a run while it goes on and stops it (the disk budget and the
writes it counts, the hijack tripwires, model calls counted at the proxy, a dead parent)."""
