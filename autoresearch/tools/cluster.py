"""The cluster_status and backends tools."""

from __future__ import annotations

from typing import Any

from mcp.types import ToolAnnotations

from autoresearch.tools._context import ToolContext, tool_errors
from autoresearch.tools.models import BackendInfo, BackendsResult, ClusterResult, Node, ProjectUsage, from_view

MAX_PROJECTS = 50  # few tokens: `autoresearch nodes --json` lists them all


def register(server: Any, ctx: ToolContext) -> None:
    @server.tool(annotations=ToolAnnotations(title="Cluster status", read_only_hint=True, open_world_hint=False))
    @tool_errors
    def cluster_status() -> ClusterResult:
        """Show the cluster: each node with its GPUs free/total, health state (since when, last findings), cordoned and
        degraded nodes with reasons, and the queue.

        Use it before submitting big jobs (how many GPUs are free?) or to understand why a
        job is still queued (queued counts per priority class: critical, normal,
        best-effort). Queue and running counts cover only the jobs you can see. Projects (the
        busiest 50): each one's GPUs in use against its quota, guarantee, borrow limit and
        fair-share weight, its decayed past usage and the share the queue orders by.
        """
        view = ctx.api.cluster(project=ctx.caller_project())
        nodes = [from_view(Node, n) for n in view.nodes]
        for node in nodes:
            node.findings = node.findings[:2]  # few tokens: `autoresearch nodes` shows more
        return ClusterResult(nodes=nodes, gpus_total=view.gpus_total,
                             gpus_free=view.gpus_free, gpus_used=view.gpus_total - view.gpus_free,
                             running=view.running, queued=view.queued, cordoned=view.cordoned,
                             degraded=view.degraded,
                             projects=[from_view(ProjectUsage, p) for p in _busiest(view.projects)])

    @server.tool(annotations=ToolAnnotations(title="Backends", read_only_hint=True, open_world_hint=True))
    @tool_errors
    def backends() -> BackendsResult:
        """List the backends jobs can run on (profiles of config.yaml and built-in kinds) with their
        capabilities (gpus, containers, preemption, ...) and whether each answers now.

        Use it before submitting to a cluster, or when jobs stay queued: a backend that does
        not answer comes with the engine's error and a hint. Probes take up to 10 seconds.
        """
        rows = ctx.api.backends(probe=True, timeout=10.0)
        bad = [r.name for r in rows if r.ok is False]
        return BackendsResult(backends=[from_view(BackendInfo, r) for r in rows],
                              next_step=(f"not answering: {', '.join(bad)}; see each hint" if bad else
                                         "all answer; submit goes to the default one"))


def _busiest(projects: list[Any]) -> list[Any]:
    """At most MAX_PROJECTS rows, the busiest (GPUs held, queued jobs, past usage) first."""
    return sorted(projects, key=lambda p: (-p.gpus_used, -p.queued, -p.decayed_gpu_h, p.project))[:MAX_PROJECTS]
