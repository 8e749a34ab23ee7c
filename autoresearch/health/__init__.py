"""GPU fleet health: preflight checks, a runtime monitor, failure classes, automatic cordons.

One small module per part (docs/architecture.md names them):

* :mod:`.nvml` — the NVML adapter (nvidia-ml-py, lazily) and its recorded twin (JSON states);
* :mod:`.config` — thresholds, from the ``health:`` section of the home's config.yaml;
* :mod:`.findings` — a finding, and the rules that turn an NVML sample into findings;
* :mod:`.signatures` — log lines that say whose fault a crash was;
* :mod:`.policy` — pure: findings -> node state, an ending -> failure class (infra, user);
* :mod:`.preflight` · :mod:`.probe` — before an attempt starts; the optional probe job;
* :mod:`.monitor` — the checks inside the pass (no daemon), and node reviews;
* :mod:`.store` — their SQL (findings are ``finding`` events; node health on ``nodes``).

Nothing here is imported on a status read; a pass imports the monitor, never pynvml
unless this process can see a node's GPUs.
"""
