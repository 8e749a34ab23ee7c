"""What an engine whose nodes are not this host is handed of an attempt's environment.

An attempt's ``LaunchRequest.env`` is complete: the submitter's own environment (single-user
jobs inherit it, like Slurm's ``--export=ALL``), the runtime's variables and the job's ``env``.
The local and Slurm backends run it on hosts that share it. Ray, Kubernetes and Databricks
write it into a job submission, a Job manifest or a workload command that the engine stores,
shows on its dashboard and hands its nodes in plain text: there only what the job asked for
goes (:func:`sent_env`), and a secret goes as a reference to the engine's own secret store
(``LaunchRequest.secret_env``), never as its value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from autoresearch.util.redact import is_secret

# The runtime's own variables: the attempt's identity, its metrics and checkpoint paths, its MLflow run.
RUNTIME_PREFIXES = ("AUTORESEARCH_", "MLFLOW_")
# What the runtime sets per attempt outside those prefixes (rendezvous of a gang, unbuffered output).
RUNTIME_NAMES = frozenset({"PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE",
                           "RANK", "NODE_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})
NEVER = frozenset({"AUTORESEARCH_TOKENS"})  # the server's tokens file, whatever its value


def sent_env(request: Any, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``request`` (a LaunchRequest) an engine gets: the job's own ``env``
    (``request.job_env``, always), the runtime's (:data:`RUNTIME_PREFIXES`, :data:`RUNTIME_NAMES`;
    a secret-named one such as ``MLFLOW_TRACKING_TOKEN`` only when the job asked for it), and a
    value set for this attempt that the launching process's environment does not hold as it is.
    Never the submitter's own variables: ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``PATH``, ``HOME``."""
    environ = os.environ if environ is None else environ
    asked = set(getattr(request, "job_env", ()) or ())
    out: dict[str, str] = {}
    for name, value in request.env.items():
        if name in asked:
            out[name] = value
        elif name in NEVER:
            continue
        elif name in RUNTIME_NAMES or (name.startswith(RUNTIME_PREFIXES) and not is_secret(name)) \
                or environ.get(name) != value:
            out[name] = value
    return out
