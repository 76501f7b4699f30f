"""``kagura-agent demo``: a real agent loop to watch without a key.

The real Claude Code CLI (the one claude-agent-sdk bundles, in the agent image) runs in
the membrane through ``apply``, as any run does; its model is a scripted endpoint that
ships for this purpose (endpoint.py) and says in every answer that it is not a model.
world.py makes the throwaway project, manifests and the endpoint's container; drive.py
runs apply as the cockpit does and shows the run, answering its question.
"""
