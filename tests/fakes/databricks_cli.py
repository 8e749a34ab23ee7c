"""A fake ``databricks`` CLI for the AI Runtime commands: records every command line and runs
each workload's ``command`` as a real local process.

    python databricks_cli.py [--profile P] air run -f workload.yaml [--idempotency-key K] [-o json]
    python databricks_cli.py [--profile P] air get RUN [-o json]
    python databricks_cli.py [--profile P] air logs RUN
    python databricks_cli.py [--profile P] air cancel RUN
    python databricks_cli.py [--profile P] air list [-o json]

State lives under ``$FAKE_DATABRICKS_HOME``: ``calls.jsonl`` (argv of every call), ``keys/<K>``
(idempotency key -> run id, created with O_EXCL), ``runs/<RUN>/`` (workload.yaml, log, exit.json,
cancelled). A detached runner (``--runner DIR``) runs the command through ``/bin/sh -c`` in its
own process group and writes ``exit.json``; ``cancel`` sends it SIGTERM and SIGKILL after
``$FAKE_DATABRICKS_GRACE`` seconds (the engine's grace; default 3).

Faults: ``$FAKE_DATABRICKS_FAIL`` = ``auth`` (every call fails as an expired login does),
``reject:<message>`` (``air run`` fails with that message), ``pending`` (runs stay PENDING).
The JSON field names (``run_id``, ``state``, ``exit_code``, ``state_message``) are this fake's;
the real CLI's are not documented where we looked (see autoresearch/backends/databricks.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

HOME = Path(os.environ.get("FAKE_DATABRICKS_HOME", "/tmp/fake-databricks"))


def _fail(message: str, code: int = 1) -> None:
    print(f"Error: {message}", file=sys.stderr)
    sys.exit(code)


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def runner(run_dir: Path) -> None:
    """The workload: run the command, forward a cancel, record how it ended."""
    import yaml

    workload = yaml.safe_load((run_dir / "workload.yaml").read_text())
    if (run_dir / "cancelled").exists():  # cancelled while pending: never runs
        (run_dir / "exit.json").write_text(json.dumps({"exit_code": None}))
        return
    env = dict(os.environ)
    secrets = json.loads(os.environ.get("FAKE_DATABRICKS_SECRETS", "{}"))  # {"scope/key": value}
    for name, value in (workload.get("env_variables") or {}).items():  # {{secrets/scope/key}} resolved here
        ref = re.fullmatch(r"\{\{secrets/([^/]+/[^/]+)\}\}", str(value))
        env[name] = secrets.get(ref.group(1), "") if ref else str(value)
    with (run_dir / "log").open("wb") as log:
        child = subprocess.Popen(["/bin/sh", "-c", workload["command"]], stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    grace = float(os.environ.get("FAKE_DATABRICKS_GRACE", "3"))

    def cancel(*_: object) -> None:
        (run_dir / "cancelled").touch()
        try:
            os.killpg(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)

    signal.signal(signal.SIGTERM, cancel)
    (run_dir / "child.pid").write_text(str(child.pid))  # after the handler: `cancel` signals us once this exists
    if (run_dir / "cancelled").exists():  # a cancel that came between the check above and child.pid
        cancel()
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    (run_dir / "exit.json.tmp").write_text(json.dumps({"exit_code": 128 - code if code < 0 else code}))
    os.replace(run_dir / "exit.json.tmp", run_dir / "exit.json")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--runner"]:
        runner(Path(argv[1]))
        return
    HOME.mkdir(parents=True, exist_ok=True)
    with (HOME / "calls.jsonl").open("a") as f:
        f.write(json.dumps(argv) + "\n")
    args = list(argv)
    if args[:1] == ["--profile"]:
        args = args[2:]
    as_json = "-o" in args and args[args.index("-o") + 1] == "json"
    if as_json:
        i = args.index("-o")
        del args[i: i + 2]
    fault = os.environ.get("FAKE_DATABRICKS_FAIL", "")
    if fault == "auth":
        _fail("default auth: cannot configure default credentials, please check "
              "https://docs.databricks.com/en/dev-tools/auth.html#databricks-client-unified-authentication")
    if args[:1] != ["air"] or len(args) < 2:
        _fail(f"unknown command {' '.join(args[:2])!r} for \"databricks\"")
    verb, rest = args[1], args[2:]
    if verb == "run":
        if fault.startswith("reject:"):
            _fail(fault.split(":", 1)[1])
        spec = Path(rest[rest.index("-f") + 1])
        key = rest[rest.index("--idempotency-key") + 1] if "--idempotency-key" in rest else ""
        run = uuid.uuid4().hex[:12]
        if key:
            (HOME / "keys").mkdir(exist_ok=True)
            try:
                fd = os.open(HOME / "keys" / key, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                existing = (HOME / "keys" / key).read_text()
                print(json.dumps({"run_id": existing, "state": _state(existing)[0]}))
                return
            os.write(fd, run.encode())
            os.close(fd)
        run_dir = HOME / "runs" / run
        run_dir.mkdir(parents=True)
        (run_dir / "workload.yaml").write_bytes(spec.read_bytes())
        if fault != "pending":
            subprocess.Popen([sys.executable, __file__, "--runner", str(run_dir)], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(json.dumps({"run_id": run, "state": "PENDING"}))
        return
    if not rest:
        if verb == "list":
            print(json.dumps({"runs": [{"run_id": p.name, "state": _state(p.name)[0]}
                                       for p in sorted((HOME / "runs").glob("*"))]}))
            return
        _fail(f"air {verb}: missing RUN")
    run = rest[0]
    run_dir = HOME / "runs" / run
    if not run_dir.is_dir():
        _fail(f"run {run} does not exist", 1)
    if verb == "get":
        state, code = _state(run)
        out: dict[str, object] = {"run_id": run, "state": state}
        if code is not None:
            out["exit_code"] = code
        print(json.dumps(out))
    elif verb == "logs":
        log = run_dir / "log"
        sys.stdout.write(log.read_text(errors="replace") if log.exists() else "")
    elif verb == "cancel":
        if not (run_dir / "exit.json").exists():
            (run_dir / "cancelled").touch()
        if (run_dir / "child.pid").exists() and not (run_dir / "exit.json").exists():
            for pid in _runner_pids(run_dir):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        print(json.dumps({"run_id": run, "state": "CANCELING"}) if as_json else f"cancelled {run}")
    else:
        _fail(f"unknown command \"air {verb}\"")


def _runner_pids(run_dir: Path) -> list[int]:
    """The runner of ``run_dir``: the parent of the workload's process."""
    child = int((run_dir / "child.pid").read_text())
    try:
        stat = Path(f"/proc/{child}/stat").read_text()
    except OSError:
        return []
    return [int(stat.rsplit(")", 1)[1].split()[1])]


def _state(run: str) -> tuple[str, int | None]:
    run_dir = HOME / "runs" / run
    done = _read_json(run_dir / "exit.json")
    if done is None:
        return ("RUNNING" if (run_dir / "child.pid").exists() else "PENDING"), None
    code = done.get("exit_code")
    code = code if isinstance(code, int) else None
    if (run_dir / "cancelled").exists():
        return "CANCELED", code
    return ("SUCCEEDED" if code == 0 else "FAILED"), code


if __name__ == "__main__":
    main(sys.argv[1:])
