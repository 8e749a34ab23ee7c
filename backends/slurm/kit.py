#!/usr/bin/env python3
"""A dev Slurm cluster (one node, or several slurmd on this host) in a private directory, from Debian's ``slurm-wlm munge``.

    python3 backends/slurm/kit.py start [--dir DIR] [--gpus 4] [--nodes 2]   # prints `export SLURM_CONF=...`
    python3 backends/slurm/kit.py status [--dir DIR]
    python3 backends/slurm/kit.py stop [--dir DIR]

Everything lives under DIR (default ``$AUTORESEARCH_SLURM_KIT`` or
``~/.local/state/autoresearch/slurm``): the configs rendered from ``slurm.conf.in`` and
``gres.conf.in`` beside this file, a private munge key and socket, spool and state
directories, logs, PID files, and fake GPUs (symlinks ``dev/nvidiaN -> /dev/null``: gres
needs device-like paths). The daemons are stopped by their PID files, never by name, so a
kit never touches another Slurm or munge on the machine. Stdlib only.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DAEMONS = ("slurmd", "slurmctld", "munged")  # stop order (start order is the reverse)


def default_dir() -> Path:
    return Path(os.environ.get("AUTORESEARCH_SLURM_KIT") or Path.home() / ".local/state/autoresearch/slurm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, IndexError):
        return None


def node_names(nodes: int) -> list[str]:
    """The kit's node names: the host's own for one node; ``<host>-<i>`` for several."""
    host = socket.gethostname().split(".")[0]
    return [host] if nodes <= 1 else [f"{host}-{i}" for i in range(nodes)]


def render(kit: Path, gpus: int, ctld_port: int, slurmd_port: int, nodes: int = 1,
           node_ports: list[int] | None = None) -> dict[str, str]:
    """slurm.conf and gres.conf. Several nodes are several slurmd on this host (``slurmd -N``), each
    on its own loopback address (127.0.0.<i+1>, so a gang's MASTER_ADDR tells the nodes apart) and
    its own port, spool, log and PID file (``%n`` in their paths)."""
    user = getpass.getuser()
    cpus = max(os.cpu_count() or 1, 16)
    try:
        memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20) - 512
    except (ValueError, OSError):
        memory = 1024
    values = {
        "KIT": str(kit), "USER": user, "HOST": socket.gethostname().split(".")[0], "CPUS": str(cpus),
        "MEMORY": str(max(memory, 256)), "GPUS": str(gpus), "CTLD_PORT": str(ctld_port),
        "SLURMD_PORT": str(slurmd_port), "GRES": f"Gres=gpu:{gpus}" if gpus else "",
    }
    gpu_files = f"{kit}/dev/nvidia[0-{gpus - 1}]" if gpus > 1 else f"{kit}/dev/nvidia0"
    names = node_names(nodes)
    ports = node_ports or [slurmd_port] * len(names)
    gres = f"Gres=gpu:{gpus} " if gpus else ""
    values["NODES"] = "\n".join(
        f"NodeName={name} NodeHostname={values['HOST']} NodeAddr=127.0.0.{i + 1} Port={ports[i]} "
        f"CPUs={cpus} RealMemory={values['MEMORY']} {gres}State=UNKNOWN" if len(names) > 1 else
        f"NodeName={name} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={values['MEMORY']} {gres}State=UNKNOWN"
        for i, name in enumerate(names))
    values["GRES_NODES"] = "\n".join(f"NodeName={name} Name=gpu File={gpu_files}" for name in names)
    out = {}
    for name in ("slurm.conf", "gres.conf"):
        text = (HERE / f"{name}.in").read_text()
        for key, value in values.items():
            text = text.replace("@" + key + "@", value)
        out[name] = text if (name != "gres.conf" or gpus) else ""
    return out


def _daemon_pids(kit: Path) -> dict[str, Path]:
    """PID file per running daemon name (``slurmd-<node>`` per node), in stop order."""
    run = kit / "run"
    slurmds = sorted(run.glob("slurmd*.pid")) if run.is_dir() else []
    return {**{p.stem: p for p in slurmds}, "slurmctld": run / "slurmctld.pid", "munged": run / "munged.pid"}


def start(kit: Path, gpus: int = 4, ctld_port: int = 0, slurmd_port: int = 0, wait_s: float = 60.0,
          nodes: int = 1) -> Path:
    """Start munged, slurmctld and one slurmd per node under ``kit``; return the slurm.conf path once
    every node is idle. A start that fails stops what it started (nothing is left running)."""
    try:
        return _start(kit, gpus, ctld_port, slurmd_port, wait_s, nodes)
    except BaseException:
        stop(kit, wait_s=5.0)
        raise


def _start(kit: Path, gpus: int, ctld_port: int, slurmd_port: int, wait_s: float, nodes: int) -> Path:
    for tool in ("munged", "slurmctld", "slurmd", "sinfo"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            raise SystemExit(f"{tool} is not installed: apt-get install -y slurm-wlm munge")
    conf = kit / "etc" / "slurm.conf"
    names = node_names(nodes)
    pidfiles = [kit / "run" / "slurmctld.pid", kit / "run" / "munged.pid",
                *(kit / "run" / f"slurmd-{n}.pid" for n in names)]
    if conf.exists() and all(_pid(p) for p in pidfiles):
        return conf  # already up
    stop(kit)
    for sub in ("etc", "run", "log", "munge", "spool/ctld", "spool/d", "dev"):
        (kit / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(kit, 0o700)
    os.chmod(kit / "munge", 0o700)
    for i in range(gpus):
        link = kit / "dev" / f"nvidia{i}"
        if not link.is_symlink():
            link.symlink_to("/dev/null")
    slurmd_port = slurmd_port or free_port()
    ports = [slurmd_port] + [free_port() for _ in names[1:]]
    files = render(kit, gpus, ctld_port or free_port(), slurmd_port, nodes, ports)
    for name in names:
        (kit / "spool" / "d" / name).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (kit / "etc" / name).write_text(text)
    key = kit / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    sock = kit / "munge" / "munge.sock"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    _run(["munged", f"--socket={sock}", f"--key-file={key}", f"--pid-file={kit}/run/munged.pid",
          f"--log-file={kit}/log/munged.log", f"--seed-file={kit}/munge/munged.seed", "--force"], env)
    _run(["slurmctld", "-f", str(conf)], env)  # daemonizes; writes its PID file
    for name in names:
        _run(["slurmd", "-f", str(conf), *(["-N", name] if nodes > 1 else [])], env)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True,
                             timeout=10)
        up = {line.split()[0] for line in out.stdout.splitlines()
              if len(line.split()) == 2 and line.split()[1] in ("idle", "mixed", "allocated")}
        if out.returncode == 0 and up >= set(names):
            return conf
        time.sleep(0.3)
    raise SystemExit(f"the kit's nodes did not come up within {wait_s:.0f}s; see {kit}/log/")


def _run(argv: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:1])} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")


def stop(kit: Path, wait_s: float = 15.0) -> None:
    """Stop the kit: cancel its jobs, then its daemons by their PID files (TERM, then KILL), never by
    name; then any job step still holding the kit's files open (a slurmstepd that outlived slurmd)."""
    conf = kit / "etc" / "slurm.conf"
    if conf.exists() and _pid(kit / "run" / "slurmctld.pid"):
        env = {**os.environ, "SLURM_CONF": str(conf)}
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["scancel", "--user", getpass.getuser()], env=env, capture_output=True, timeout=10)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and subprocess.run(
                    ["squeue", "-h", "-t", "R,CG,CF,S", "-o", "%i"], env=env, capture_output=True, text=True,
                    timeout=10).stdout.strip():
                time.sleep(0.2)
    for pidfile in _daemon_pids(kit).values():
        pid = _pid(pidfile)
        if pid is not None:
            _end(pid, wait_s)
        with contextlib.suppress(OSError):
            pidfile.unlink()
    for pid in _holding(kit):
        _end(pid, 2.0)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:][:1] != b"Z"
    except (OSError, ValueError):
        return False


def _end(pid: int, wait_s: float) -> None:
    """TERM ``pid``, wait for the process itself (slurmd drops its PID file before it is gone), then KILL."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _holding(kit: Path) -> list[int]:
    """Processes of ours with a file of the kit open (its spool, state or logs): leftover job steps."""
    inside = str(kit) + os.sep
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            if any(os.readlink(f"/proc/{entry}/fd/{fd}").startswith(inside) for fd in os.listdir(f"/proc/{entry}/fd")):
                found.append(int(entry))
        except OSError:
            continue
    return found


def restart_ctld(kit: Path) -> None:
    """Stop slurmctld and start it again (its state survives in spool/ctld): the fault tests use it."""
    pidfile = kit / "run" / "slurmctld.pid"
    pid = _pid(pidfile)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        while _pid(pidfile) == pid:
            time.sleep(0.1)
    conf = kit / "etc" / "slurm.conf"
    _run(["slurmctld", "-f", str(conf)], {**os.environ, "SLURM_CONF": str(conf)})


def status(kit: Path) -> dict[str, int | None]:
    return {name: _pid(path) for name, path in _daemon_pids(kit).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="backends/slurm/kit.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop", "status", "restart-ctld"))
    parser.add_argument("--dir", type=Path, default=None, help="kit directory (default: %(default)s)")
    parser.add_argument("--gpus", type=int, default=4, help="fake GPUs on the node")
    parser.add_argument("--port", type=int, default=0, help="slurmctld port (default: a free one)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (slurmd daemons on this host)")
    args = parser.parse_args(argv)
    kit = (args.dir or default_dir()).expanduser().resolve()
    if args.action == "start":
        conf = start(kit, args.gpus, args.port, nodes=max(1, args.nodes))
        print(f"export SLURM_CONF={conf}")
    elif args.action == "stop":
        stop(kit)
    elif args.action == "restart-ctld":
        restart_ctld(kit)
    else:
        for daemon, pid in status(kit).items():
            print(f"{daemon}\t{pid or 'stopped'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
