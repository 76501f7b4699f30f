"""Allowlist checking, squid.conf rendering and log parsing: pure, no Docker."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from kagura_agent.errors import RefusedError
from kagura_agent.manifest.hosts import is_ip_literal, normalize_host
from kagura_agent.membrane.egress import audit, hostaddrs
from kagura_agent.membrane.egress.policy import load_policy, subtract
from kagura_agent.membrane.egress.squid import render_squid_conf
from kagura_agent.state import StateStore


def test_defaults_are_https_on_443() -> None:
    policy = load_policy({"mode": "proxy", "allow": [{"host": "API.GitHub.com."}]})
    (entry,) = policy.entries
    assert (entry.host, entry.port, entry.scheme) == ("api.github.com", 443, "https")
    assert policy.match("api.github.com", 443, connect=True) is entry
    assert policy.match("api.github.com", 80, connect=True) is None
    assert policy.match("api.github.com", 443, connect=False) is None  # plain http


def test_wildcard_matches_below_the_domain_only() -> None:
    policy = load_policy({"mode": "proxy", "allow": [{"host": "*.example.com"}]})
    assert policy.match("a.example.com", 443, True) is not None
    assert policy.match("a.b.example.com", 443, True) is not None
    assert policy.match("example.com", 443, True) is None
    assert policy.match("badexample.com", 443, True) is None
    conf = render_squid_conf(policy, ["172.30.0.0/16"])
    assert r"dstdom_regex -n -i ^([a-z0-9_-]+\.)+example\.com\.?$" in conf
    assert "dstdomain -n .example.com" not in conf


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"host": "10.0.0.1"}, "IP literal"),
        ({"host": "[::1]"}, "IP literal"),
        ({"host": "2130706433"}, "IP literal"),
        ({"host": "*.com"}, "at least two labels"),
        ({"host": "exa mple.com"}, "whitespace"),
        ({"host": "a.*.example.com"}, "first label"),
        ({"host": "allowed.test\nhttp_access allow all"}, "a control"),
        ({"host": "127.0.0.1."}, "IP literal"),
        ({"host": "example.com", "port": 0}, "port"),
        ({"host": "example.com", "port": True}, "port"),
        ({"host": "example.com", "scheme": "ftp"}, "scheme"),
        ({"host": "example.com", "prot": 443}, "unknown keys"),
        ({"host": "example.com", "allow_addresses": ["10.0.0.1/8"]}, "CIDR"),
    ],
)
def test_bad_entries_are_refused(entry: dict[str, object], message: str) -> None:
    with pytest.raises(RefusedError, match=message):
        load_policy({"mode": "proxy", "allow": [entry]})


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(RefusedError) as caught:
        load_policy({"mode": "proxy", "allow": [{"host": "1.2.3.4"}, {"host": "x.y", "port": -1}]})
    assert "allow[0]" in caught.value.message and "allow[1]" in caught.value.message


def test_ip_literal_forms() -> None:
    for text in ("127.0.0.1", "0x7f.1", "017700000001", "::ffff:10.0.0.1", "[fe80::1]"):
        assert is_ip_literal(text), text
    for text in ("example.com", "cafe.example", "1password.com"):
        assert not is_ip_literal(text), text


def test_forbidden_ranges_minus_explicit_allowances() -> None:
    policy = load_policy(
        {
            "mode": "proxy",
            "allow": [{"host": "a.test", "allow_addresses": ["10.1.0.0/16"]}, {"host": "b.test"}],
            "allow_addresses": ["192.168.0.0/16"],
        }
    )
    a, b = (set(map(str, policy.forbidden_for(e))) for e in policy.entries)
    # The section's list is the planner's summary for reviewers, never an exception.
    assert "192.168.0.0/16" in a and "192.168.0.0/16" in b
    assert "10.0.0.0/8" in b and "10.0.0.0/8" not in a
    assert "10.0.0.0/16" in a and "10.2.0.0/15" in a  # the rest of 10/8 stays forbidden
    assert {"169.254.0.0/16", "127.0.0.0/8", "fc00::/7", "fe80::/10"} <= a & b


def test_the_docker_hosts_own_addresses_are_forbidden_like_a_range() -> None:
    """A host address in no forbidden range (a public one) is refused for every entry but
    one whose own allow_addresses covers it; one inside a range is not listed twice."""
    host = [ipaddress.ip_network(a) for a in ("192.0.2.2/32", "172.17.0.1/32", "2001:db8::2/128")]
    policy = load_policy(
        {
            "mode": "proxy",
            "allow": [
                {"host": "a.test"},
                {"host": "lab.test", "allow_addresses": ["192.0.2.0/24"]},
            ],
        }
    ).on_host(host)
    a, lab = (set(map(str, policy.forbidden_for(e))) for e in policy.entries)
    assert {"192.0.2.2/32", "2001:db8::2/128"} <= a and "172.17.0.1/32" not in a
    assert "192.0.2.2/32" not in lab and "2001:db8::2/128" in lab
    conf = render_squid_conf(policy, ["127.0.0.1/32"])
    assert "192.0.2.2/32" in conf.split("acl e0_forbidden dst ")[1].splitlines()[0]


def test_the_docker_hosts_addresses_are_read_from_its_interfaces(tmp_path: Path) -> None:
    trie = tmp_path / "fib_trie"
    trie.write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 192.0.2.2\n        /32 host LOCAL\n"
        "     |-- 192.0.2.255\n        /32 link BROADCAST\n     |-- 127.0.0.1\n"
        "        /32 host LOCAL\n"
    )
    inet6 = tmp_path / "if_inet6"
    inet6.write_text("20010db8000000000000000000000002 02 40 00 80     eth0\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hostaddrs, "_FIB_TRIE", trie)
        patch.setattr(hostaddrs, "_IF_INET6", inet6)
        found = hostaddrs.docker_host_addresses("unix:///var/run/docker.sock")
    assert list(map(str, found)) == ["127.0.0.1/32", "192.0.2.2/32", "2001:db8::2/128"]


def test_subtract_whole_and_partial() -> None:
    nets = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fc00::/7")]
    assert subtract(nets, [ipaddress.ip_network("0.0.0.0/0")]) == [nets[1]]
    left = subtract(nets[:1], [ipaddress.ip_network("10.128.0.0/9")])
    assert left == [ipaddress.ip_network("10.0.0.0/9")]


def test_rendered_rules_deny_by_default_and_check_resolved_addresses() -> None:
    policy = load_policy(
        {
            "mode": "proxy",
            "allow": [
                {"host": "api.github.com"},
                {"host": "plain.test", "port": 8080, "scheme": "http"},
            ],
        }
    )
    conf = render_squid_conf(policy, ["172.30.0.0/16"])
    lines = [line for line in conf.splitlines() if line.startswith("http_access")]
    assert lines[0] == "http_access deny !agents why_client"
    assert lines[1] == "http_access deny ip_literal why_ip_literal"
    assert lines[-1] == "http_access deny all why_not_allowed"
    assert "http_access allow e0_host e0_port CONNECT" in lines
    assert "http_access deny e0_host e0_port CONNECT e0_forbidden why_private_address" in lines
    assert "http_access allow e1_host e1_port !CONNECT plain_http" in lines
    assert "acl e0_host dstdomain -n api.github.com" in conf
    assert "acl agents src 172.30.0.0/16" in conf
    with pytest.raises(ValueError):
        render_squid_conf(policy, [])


def test_no_entries_renders_deny_all() -> None:
    conf = render_squid_conf(load_policy({"mode": "proxy", "allow": []}), ["10.9.0.0/24"])
    assert [x for x in conf.splitlines() if x.startswith("http_access allow")] == []


LOG = (
    "2026/01/01 squid started\n"
    "KAGURA1 1767225600.123 172.18.0.3 CONNECT - api.github.com 443 200 TCP_TUNNEL 120 5000"
    " 140.82.0.1 -\n"
    "KAGURA1 1767225601.000 172.18.0.3 CONNECT - evil.test 443 403 TCP_DENIED 118 3400 - "
    "not-allowed\n"
    "KAGURA1 1767225602.000 172.18.0.3 GET http api.github.com 443 403 TCP_DENIED 130 3400 - "
    "not-allowed\n"
    "KAGURA1 1767225603.000 172.18.0.3 CONNECT - api.github.com 443 403 TCP_DENIED 118 3400 - "
    "private-address\n"
)


def test_log_lines_become_events_with_the_matching_entry() -> None:
    policy = load_policy({"mode": "proxy", "allow": [{"host": "api.github.com"}]})
    events = audit.events_from_log(LOG, policy, "r1")
    assert [(e.seq, e.decision, e.reason, e.entry) for e in events] == [
        (0, "allow", "allowed", "api.github.com:443/https"),
        (1, "deny", "host-not-listed", None),
        (2, "deny", "scheme-not-allowed", None),
        (3, "deny", "private-address", "api.github.com:443/https"),
    ]
    assert events[0].time == "2026-01-01T00:00:00.123Z" and events[0].bytes_out == 5000
    assert audit.parse_line("KAGURA1 too few fields") is None


def test_events_are_stored_once_and_summarised(tmp_path: Path) -> None:
    store = audit.open_store(StateStore(tmp_path / "state.db"))
    policy = load_policy({"mode": "proxy", "allow": [{"host": "api.github.com"}]})
    audit.record_run(store, "r1", "2026-01-01T00:00:00Z", {"mode": "proxy", "allow": []})
    events = audit.events_from_log(LOG + LOG.splitlines()[2] + "\n", policy, "r1")
    assert len(audit.record_events(store, events)) == 5
    assert audit.record_events(store, events) == []  # re-reading the log adds nothing
    assert [e.seq for e in audit.load_events(store, "r1")] == [0, 1, 2, 3, 4]
    assert audit.latest_run(store) == "r1"
    summary = audit.denial_summary(audit.load_events(store, "r1"))
    assert summary[0] == {
        "method": "CONNECT",
        "host": "evil.test",
        "port": 443,
        "reason": "host-not-listed",
        "count": 2,
    }


def test_one_entrys_exception_never_reaches_another_entry_in_squid_conf() -> None:
    policy = load_policy(
        {
            "mode": "proxy",
            "allow": [
                {"host": "inside.test", "allow_addresses": ["10.0.0.0/8"]},
                {"host": "other.test"},
            ],
            "allow_addresses": ["10.0.0.0/8"],
        }
    )
    conf = render_squid_conf(policy, ["127.0.0.1/32"])
    forbidden = {
        line.split()[1]: line.split()[3:]
        for line in conf.splitlines()
        if line.startswith("acl e") and " dst " in line
    }
    assert "10.0.0.0/8" in forbidden["e1_forbidden"]
    assert not any(n.startswith("10.") for n in forbidden["e0_forbidden"])


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("127.0.0.1.", "IP literal"),
        ("0x7f.1", "IP literal"),
        ("[::1]", "IP literal"),
        ("allo\u200bwed.test", "invisible"),
        ("allowed.test\u200d", "invisible"),
        ("\uff11\uff12\uff17.0.0.1", "not a letter"),
        ("api\u3002github.com", "as a dot"),
        ("api\uff0egithub.com", "as a dot"),
        ("example.123", "numeric"),
        ("a." * 130 + "test", "at most 253"),
        ("a" * 64 + ".test", "not a valid host name"),
        ("allowed.test\nhttp_access allow all", "a control"),
        ("allowed.test\r", "a control"),
        (" allowed.test", "whitespace"),
        ("allowed.test:443", "port"),
        ("https://allowed.test", "scheme"),
        ("*", "every host"),
        ("a.*.test", "first label"),
        ("", "empty"),
    ],
)
def test_the_one_normaliser_refuses_what_squid_could_not_take(host: str, message: str) -> None:
    normal, problem = normalize_host(host)
    assert normal is None and message in problem, problem
    with pytest.raises(RefusedError, match=r"allow\[0\]\.host"):
        load_policy({"mode": "proxy", "allow": [{"host": host}]})


@pytest.mark.parametrize(
    ("host", "normal"),
    [
        ("API.GitHub.com.", "api.github.com"),
        ("*.Example.COM", "*.example.com"),
        ("b\u00fccher.example", "xn--bcher-kva.example"),
        ("1password.com", "1password.com"),
    ],
)
def test_the_one_normaliser_accepts_names(host: str, normal: str) -> None:
    assert normalize_host(host) == (normal, "")


def test_squid_renderer_refuses_a_host_that_bypassed_the_normaliser() -> None:
    from kagura_agent.membrane.egress.policy import AllowEntry, EgressPolicy

    for host in ("evil.test\nhttp_access allow all", "evil .test", "\u0435vil.test"):
        policy = EgressPolicy(mode="proxy", entries=(AllowEntry(host=host),))
        with pytest.raises(RefusedError, match=r"squid\.conf"):
            render_squid_conf(policy, ["127.0.0.1/32"])
    policy = EgressPolicy(mode="proxy", entries=(AllowEntry(host="ok.test", policy="p\nx y"),))
    assert "\nx y" not in render_squid_conf(policy, ["127.0.0.1/32"])


def test_an_injected_credential_is_a_plain_token_and_in_no_configuration() -> None:
    from kagura_agent.membrane.egress.modelport import (
        CallLimits,
        Injection,
        ModelCallPolicy,
        check_secret,
        render_nginx_conf,
    )

    injection = Injection(host="api.anthropic.com")
    check_secret("sk-ant-abc_123")
    for bad in ('a"b', "a\nhttp_access allow all", "a b", ""):
        with pytest.raises(RefusedError, match="plain token"):
            check_secret(bad)
    conf = render_nginx_conf(injection)
    policy = ModelCallPolicy().lua_config(injection)
    limits = CallLimits.for_budget(30, 4).to_json()
    assert not any("sk-ant" in text for text in (conf, policy, limits))
    # The upstream's certificate is checked against the system's CAs, by its name.
    assert "server __KAGURA_UPSTREAM_ADDRESS__:443;" in conf and "proxy_ssl_verify on;" in conf
    assert "proxy_ssl_name api.anthropic.com;" in conf and "proxy_buffering off;" in conf
    assert "proxy_pass https://model_api$kagura_target;" in conf
    with pytest.raises(RefusedError):
        render_nginx_conf(Injection(host="evil.test;\n  include /etc/passwd"))
    assert json.loads(limits) == {
        "turn": 30,
        "side": 30,
        "free": 120,
        "files": None,
        "concurrency": 4,
    }
    assert json.loads(CallLimits.for_budget(None, 2).to_json())["turn"] is None
    config = json.loads(
        ModelCallPolicy(betas=("claude-code", "web-search-2025-03-05")).lua_config(injection)
    )
    assert (config["betas"], config["beta_families"]) == (
        ["web-search-2025-03-05"],
        ["claude-code"],
    )
    for bad_policy in (
        ModelCallPolicy(betas=("a b",)),
        ModelCallPolicy(server_tools=("teleport",)),
        ModelCallPolicy(mcp_servers=("evil test",)),
    ):
        with pytest.raises(RefusedError):
            bad_policy.lua_config(injection)
