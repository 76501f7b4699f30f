"""The serve cockpit: a trusted host process that takes operators' commands from a chat
transport and runs the same plan → approve → apply path as the CLI.

transport.py  Event and the Transport protocol (the one seam to chat)
intents.py    structural intent recognition (no model reads chat text here)
registry.py   sessions in the state store; reconcile after a restart
runner.py     apply as its own process, its progress relayed in batches
core.py       the Cockpit: the operator gate, each intent to the job that owns it
desk.py       what the jobs share: settings, sessions held in memory, posting to a thread
launch.py     plan, launch, run, continue; approval requests and their answers
sessions.py   an approved session: queued or started, followed, finished, released
control.py    a session in flight: kill, steer, answers to its mid-run questions
status.py     the status view; graduations.py graduation proposals in chat
terminal.py   the terminal transport; slack.py the Slack one (slack extra)
"""
