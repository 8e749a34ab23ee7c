"""A simulated GPU fleet (docs/sim.md): the test double for clusters.

* :mod:`~autoresearch.sim.fleet`: the fleet's configuration (node types, faults, seed, clock), validated;
* :mod:`~autoresearch.sim.faults`: the seeded fault schedule per node (node loss, Xid, NCCL hang,
  thermal throttling) and what a node's GPUs read like at a moment (NVML-like samples);
* :mod:`~autoresearch.sim.trials`: what a trial does (a duration model, a replayed curve, a function);
* :mod:`~autoresearch.sim.curves`: tables of learning curves recorded once, replayed by trials;
* :mod:`~autoresearch.sim.timeline`: one attempt's life as a pure function of its record, the faults
  and the stop it got (checkpoint-interval semantics: work since the last checkpoint is lost);
* :mod:`~autoresearch.sim.clock`: simulated time (wall x speed, or advanced event by event);
* :mod:`~autoresearch.sim.driver`: a fast in-process discrete-event driver for whole-fleet studies.

The backend over these is ``autoresearch/backends/sim.py`` (kind ``sim``). Stdlib only.
"""
