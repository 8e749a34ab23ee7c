#!/usr/bin/env python3
"""A private Docker engine in a directory, from Debian's ``docker.io``, and a test image built here.

    python3 backends/docker/kit.py start [--dir DIR]   # prints `export DOCKER_HOST=unix://DIR/docker.sock`
    python3 backends/docker/kit.py image [--dir DIR]   # imports the test image (no registry needed)
    python3 backends/docker/kit.py status [--dir DIR]
    python3 backends/docker/kit.py stop [--dir DIR]

Everything lives under DIR (default ``$AUTORESEARCH_DOCKER_KIT`` or
``~/.local/state/autoresearch/docker``): ``dockerd``'s socket, PID file, data root and exec
root (its own ``containerd`` lives there too), and its log. The engine leaves the host's
firewall and bridges alone (``--iptables=false --bridge=none``: containers get no network
but the loopback, which the tests need nothing beyond), so it starts beside any other engine
and in containers that have no ``iptables``. It is stopped by its PID file, never by name.

The test image (``autoresearch-kit:test``) is built from a root filesystem tarball made here,
because no registry is reachable on CI machines: ``/bin/sh`` and a few coreutils, this
Python (``sys.prefix`` without ``site-packages``: the same path inside as outside, so
``sys.executable`` runs in the container, and ``python`` is on its PATH), and the shared libraries they load (``ldd``).
``docker import`` turns the tarball into the image. Stdlib only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

IMAGE = "autoresearch-kit:test"
TOOLS = ("sh", "dash", "sleep", "cat", "echo", "true", "false", "env", "ls", "id", "printf", "pwd", "mkdir", "rm")
SKIP = ("site-packages", "test", "tests", "idlelib", "tkinter", "ensurepip", "lib2to3", "turtledemo", "__pycache__")


def default_dir() -> Path:
    return Path(os.environ.get("AUTORESEARCH_DOCKER_KIT") or Path.home() / ".local/state/autoresearch/docker")


def host_of(kit: Path) -> str:
    return f"unix://{kit}/docker.sock"


def installed() -> str | None:
    """None when ``dockerd`` and ``docker`` are here; else what is missing."""
    for tool in ("dockerd", "docker", "containerd", "runc"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} is not installed (apt-get install -y docker.io)"
    return None


def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, IndexError):
        return None


def docker(kit: Path, *args: str, timeout: float = 60, check: bool = True,
           stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "DOCKER_HOST": host_of(kit)}
    done = subprocess.run(["docker", *args], env=env, input=stdin, capture_output=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:2])} failed: {done.stderr.decode(errors='replace').strip()}")
    return done


def start(kit: Path, wait_s: float = 60.0) -> str:
    """Start a private ``dockerd`` under ``kit``; return its DOCKER_HOST once it answers.

    Raises RuntimeError with dockerd's own words when it cannot start here."""
    missing = installed()
    if missing:
        raise RuntimeError(missing)
    kit = kit.resolve()
    if len(str(kit)) > 60:  # unix socket paths are at most 107 bytes; containerd's sits deeper than ours
        raise RuntimeError(f"the kit's directory {kit} is too long for its sockets (at most 60 characters)")
    pidfile = kit / "dockerd.pid"
    if _pid(pidfile) and docker(kit, "version", check=False, timeout=10).returncode == 0:
        return host_of(kit)
    stop(kit)
    for sub in ("data", "exec"):
        (kit / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(kit, 0o700)
    argv = [shutil.which("dockerd") or "/usr/sbin/dockerd", "--host", host_of(kit), "--pidfile", str(pidfile),
            "--data-root", str(kit / "data"), "--exec-root", str(kit / "exec"), "--iptables=false",
            "--ip6tables=false", "--ip-masq=false", "--bridge=none", "--userland-proxy=false",
            "--log-level=warn", "--exec-opt", "native.cgroupdriver=cgroupfs"]
    log = open(kit / "dockerd.log", "ab")  # noqa: SIM115 - the daemon keeps it
    with log, open(os.devnull, "rb") as null:
        proc = subprocess.Popen(argv, stdin=null, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dockerd exited ({proc.returncode}): {_tail(kit / 'dockerd.log')}")
        if docker(kit, "version", "--format", "{{.Server.Version}}", check=False, timeout=10).returncode == 0:
            return host_of(kit)
        time.sleep(0.3)
    stop(kit)
    raise RuntimeError(f"dockerd did not answer within {wait_s:.0f}s: {_tail(kit / 'dockerd.log')}")


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:].strip()
    except OSError:
        return "(no log)"


def rootfs() -> bytes:
    """The test image's root filesystem as a tar: a shell, a few tools, this Python, their libraries."""
    files: dict[str, str] = {}  # path inside -> path here (the same paths)
    for tool in TOOLS:
        found = shutil.which(tool, path="/usr/bin:/bin")
        if found:
            files[os.path.realpath(found)] = os.path.realpath(found)
            files[f"/bin/{tool}"] = os.path.realpath(found)
    files["/bin/sh"] = os.path.realpath(shutil.which("dash", path="/usr/bin:/bin") or "/bin/sh")
    prefix = os.path.realpath(sys.base_prefix)
    elves: list[str] = list(files.values())
    for root, dirs, names in os.walk(prefix):
        dirs[:] = [d for d in dirs if d not in SKIP]
        for name in names:
            full = os.path.join(root, name)
            if os.path.isfile(full) and not os.path.islink(full):
                files[full] = full
                if name.endswith(".so") or ".so." in name or root.endswith("/bin"):
                    elves.append(full)
    for lib in _libraries(elves):
        files[lib] = os.path.realpath(lib)
    exe = os.path.realpath(sys.executable)
    links = {sys.executable: exe} if sys.executable != exe else {}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for folder in ("/tmp", "/etc", "/root", "/proc", "/sys", "/dev"):
            info = tarfile.TarInfo(folder.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "/tmp" else 0o755
            tar.addfile(info)
        for inside, here in sorted(files.items()):
            tar.add(here, arcname=inside.lstrip("/"), recursive=False)
        for inside, target in links.items():
            info = tarfile.TarInfo(inside.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
    return buf.getvalue()


def _libraries(elves: list[str]) -> set[str]:
    """The shared libraries the ELF files load (``ldd``), and the loader."""
    found: set[str] = set()
    for chunk in range(0, len(elves), 200):
        done = subprocess.run(["ldd", *elves[chunk:chunk + 200]], capture_output=True, text=True, check=False)
        for line in done.stdout.splitlines():
            for word in line.split():
                if word.startswith("/") and os.path.exists(word) and not word.endswith(":"):
                    found.add(word)
    return found


def image(kit: Path, tag: str = IMAGE) -> str:
    """Import the test image into the kit's engine (once); return its tag."""
    if docker(kit, "image", "inspect", tag, check=False).returncode == 0:
        return tag
    path = f"{os.path.dirname(os.path.realpath(sys.executable))}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    docker(kit, "import", "--change", f"ENV PATH={path}",
           "-", tag, stdin=rootfs(), timeout=300)
    return tag


def stop(kit: Path, wait_s: float = 20.0) -> None:
    """Remove the kit's containers, stop ``dockerd`` by its PID file (TERM, then KILL), unmount what it left."""
    kit = kit.resolve()
    pid = _pid(kit / "dockerd.pid")
    if pid is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError, RuntimeError):
            ids = docker(kit, "ps", "-aq", timeout=20).stdout.split()
            if ids:
                docker(kit, "rm", "-f", *[i.decode() for i in ids], check=False, timeout=60)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    for mount in reversed(_mounts_under(kit)):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    with contextlib.suppress(OSError):
        (kit / "dockerd.pid").unlink()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:][:1] != b"Z"
    except (OSError, ValueError):
        return False


def _mounts_under(kit: Path) -> list[str]:
    inside = str(kit) + os.sep
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            return [line.split()[1] for line in f if line.split()[1].startswith(inside)]
    except OSError:
        return []


def status(kit: Path) -> dict[str, object]:
    pid = _pid(kit.resolve() / "dockerd.pid")
    return {"dockerd": pid, "host": host_of(kit.resolve()) if pid else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="backends/docker/kit.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "image", "stop", "status"))
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    kit = (args.dir or default_dir()).expanduser()
    try:
        if args.action == "start":
            print(f"export DOCKER_HOST={start(kit)}")
        elif args.action == "image":
            print(image(kit))
        elif args.action == "stop":
            stop(kit)
        else:
            print(status(kit))
    except RuntimeError as err:
        print(f"kit: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
