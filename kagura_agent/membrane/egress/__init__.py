"""Per-run egress: one squid proxy between the agent's internal network and the world.

The modules (import them by name; the package itself imports nothing, so a module that
needs only the forwarder's launcher does not pull in the session stack):

- request: ``EgressRequest(plan, run_id, ...)``, what a run asks of its proxy (one frozen value;
  apply's is ``EgressRequest.for_run``).
- session: ``EgressSession.start(client, request, on_event) -> EgressSession`` (a context
  manager); ``.agent_network_config() -> AgentNetworkConfig``; ``.denial_summary()``.
- sweep: ``sweep_orphans(client, store=None) -> list[str]``
- policy: ``load_policy(plan["egress"]) -> EgressPolicy``; squid: ``render_squid_conf(policy, subnets)``
- audit: ``audit.load_events(store, run_id)``, ``audit.latest_run(store)``
"""
