"""The brain layer: a normalised event stream above each engine's own agentic loop.

``protocol`` defines the Turn and the Brain protocol, ``events`` the event model,
``engines`` the three engines (script, sdk, kagura-brain), ``entrypoint`` the
in-container side of the JSON-lines channel and ``channel`` its host side.
"""
