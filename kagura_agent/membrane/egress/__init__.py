"""Per-run egress: one squid proxy between the agent's internal network and the world.

Public API (see session.py for the lifecycle, policy.py for the allowlist semantics):

- ``EgressSession.start(client, plan, run_id, on_event) -> EgressSession`` (a context
  manager); ``.agent_network_config() -> AgentNetworkConfig``; ``.denial_summary()``.
- ``sweep_orphans(client, store=None) -> list[str]``
- ``load_policy(plan["egress"]) -> EgressPolicy``; ``render_squid_conf(policy, subnets)``
- ``audit.load_events(store, run_id)``, ``audit.latest_run(store)``
"""

from kagura_agent.membrane.egress.policy import AllowEntry, EgressPolicy, load_policy
from kagura_agent.membrane.egress.session import AgentNetworkConfig, EgressSession
from kagura_agent.membrane.egress.squid import render_squid_conf
from kagura_agent.membrane.egress.sweep import sweep_orphans

__all__ = [
    "AgentNetworkConfig",
    "AllowEntry",
    "EgressPolicy",
    "EgressSession",
    "load_policy",
    "render_squid_conf",
    "sweep_orphans",
]
