"""The etcd store's durability settings, as ``dibs doctor`` reports them."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from dibs._extras import needs
from dibs.exceptions import StoreUnavailable
from dibs.stores import redact
from dibs.stores.durability import Finding, Severity
from dibs.stores.etcd._keys import parse_url

__all__ = ["etcd_findings", "findings"]


def findings(url: str, timeout: float) -> list[Finding]:
    """Member count and quorum health of the cluster at ``url``, over the v3 JSON gateway."""
    with needs("etcd", "dibs doctor on an etcd:// store"):
        import httpx  # noqa: PLC0415 (only for etcd)

    endpoints = parse_url(url).endpoints  # as the store reads them: host:port, default port
    with httpx.Client(timeout=timeout) as client:
        members: list[dict[str, Any]] | None = None
        errors: list[str] = []
        for endpoint in endpoints:
            try:
                answer = client.post(f"http://{endpoint}/v3/cluster/member/list", json={})
                answer.raise_for_status()
                members = answer.json().get("members", [])
                break
            except (httpx.HTTPError, ValueError) as exc:
                errors.append(f"{endpoint}: {exc}")
        if members is None:
            raise StoreUnavailable(
                f"no etcd endpoint of {redact(url)} answered: {'; '.join(errors)}",
                cause="; ".join(errors),
            )
        statuses: dict[str, dict[str, Any] | str] = {}
        learners: set[str] = set()
        for member in members:
            name = member.get("name") or member.get("ID", "?")
            status: dict[str, Any] | str = "no client URL"
            for client_url in member.get("clientURLs", []):
                try:
                    answer = client.post(f"{client_url}/v3/maintenance/status", json={})
                    answer.raise_for_status()
                    status = answer.json()
                    break
                except (httpx.HTTPError, ValueError) as exc:
                    status = str(exc) or type(exc).__name__
            statuses[str(name)] = status
            if member.get("isLearner"):
                learners.add(str(name))
    return etcd_findings(statuses, learners=learners)


def etcd_findings(
    statuses: dict[str, dict[str, Any] | str], *, learners: Collection[str] = ()
) -> list[Finding]:
    """Findings for a cluster's members: each one's status answer, or why it gave none.

    ``learners`` names the members that replicate but do not vote
    (``etcdctl member add --learner``): the quorum and its margin count voters only.
    """
    voters = {name: s for name, s in statuses.items() if name not in learners}
    n = len(voters)
    quorum = n // 2 + 1
    up = {name: s for name, s in voters.items() if isinstance(s, dict)}
    down = {
        (f"{name} (learner)" if name in learners else name): s
        for name, s in statuses.items()
        if not isinstance(s, dict)
    }
    found: list[Finding] = []
    if n == 1:
        found.append(
            Finding(
                Severity.WARNING,
                "members",
                "1",
                "one member: its disk is the only copy, and writes stop while it is down",
                "run 3 members (or 5), on separate machines",
            )
        )
    elif n % 2 == 0:
        found.append(
            Finding(
                Severity.WARNING,
                "members",
                str(n),
                f"an even count: {n} members survive no more failures than {n - 1} "
                f"(quorum {quorum}), and a split can leave no side with a quorum",
                f"run {n - 1} or {n + 1} members",
            )
        )
    else:
        found.append(
            Finding(
                Severity.OK,
                "members",
                str(n),
                f"quorum {quorum}: survives {n - quorum} failed member(s)",
            )
        )
    margin = len(up) - quorum
    if down:
        detail = ", ".join(f"{name} ({why})" for name, why in sorted(down.items()))
        if margin < 0:
            detail = (
                f"only {len(up)} of {n} members answer, below the quorum of {quorum}: "
                f"writes stop until members come back. Unreachable: {detail}"
            )
        else:
            detail = (
                f"{len(up)} of {n} members answer; quorum {quorum}, so {margin} more "
                f"failure(s) stop writes. Unreachable: {detail}"
            )
        found.append(
            Finding(Severity.WARNING, "reachable members", f"{len(up)}/{n}", detail, "restart them")
        )
    answering = {name: s for name, s in statuses.items() if isinstance(s, dict)}
    leaders = {str(s.get("leader")) for s in answering.values() if s.get("leader")}
    if answering and len(leaders) != 1:
        found.append(
            Finding(
                Severity.WARNING,
                "leader",
                ",".join(sorted(leaders)) or "none",
                "the members do not agree on one leader: an election is under way or the "
                "cluster is split",
                "check the members' logs and network",
            )
        )
    for name, status in sorted(answering.items()):
        errors = status.get("errors")
        if errors:
            found.append(
                Finding(
                    Severity.WARNING,
                    f"member {name}",
                    "; ".join(map(str, errors)),
                    "the member reports errors (an alarm such as NOSPACE stops writes)",
                    "etcdctl alarm list; compact, defragment, then etcdctl alarm disarm",
                )
            )
    return found
