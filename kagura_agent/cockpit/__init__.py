"""The serve cockpit: a trusted host process that takes operators' commands from a chat
transport and runs the same plan → approve → apply path as the CLI.

transport.py  Event and the Transport protocol (the one seam to chat)
intents.py    structural intent recognition (no model reads chat text here)
registry.py   sessions in the state store; reconcile after a restart
runner.py     apply as its own process, its progress relayed in batches
core.py       the Cockpit: operator gate, plans, approval requests, runs, kill
terminal.py   the terminal transport; slack.py the Slack one (slack extra)
"""
