"""How a Slurm attempt's program starts, without Slurm: the batch script's fast start (``run.sh``
sourced by ``sh``, the program started before wrap.py's Python) and a gang member's ``sh`` prologue
(its ranks from SLURM_PROCID, no Python: it runs inside a pyxis image too). Each is run here by the
same ``sh`` a compute node runs it with."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoresearch.backends import _slurm_wrap as wrap
from autoresearch.backends._base import LaunchRequest
from autoresearch.backends._slurm import SlurmBackend
from autoresearch.backends._slurm_files import GANG_MASTER, run_sh
from autoresearch.backends._slurm_wrap import MEMBER, first_failure, member_argv

SHOW = ("import json, os, signal, sys; print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(), 'argv': sys.argv[1:], "
        "'pgid': os.getpgid(0) == os.getpid(), 'ign': [s for s in (signal.SIGINT, signal.SIGQUIT) "
        "if signal.getsignal(s) == signal.SIG_IGN]}))")
ODD = "it's \"odd\" $(touch /tmp/h42-never) `x` \\ \n second line ; & |"


def _start(tmp_path: Path, script: str, outer_env: dict[str, str], sh: str = "/bin/sh"
           ) -> subprocess.CompletedProcess[str]:
    """Source ``script`` the way job.sbatch does: in a background subshell of sh, setsid found first."""
    (tmp_path / "run.sh").write_text(script)
    job = 'R="$1"; _ar_setsid=$(command -v setsid); ( . "$R/run.sh" ) & wait $!'
    return subprocess.run([sh, "-c", job, "job", str(tmp_path)], env=outer_env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("sh", ["/bin/sh", "/bin/bash"])  # (where /bin/sh is bash, `export -p` says declare -x)
def test_the_fast_start_gives_the_program_exactly_wrap_pys_environment(tmp_path: Path, sh: str) -> None:
    work = tmp_path / "work dir"
    work.mkdir()
    env = {"PATH": os.environ["PATH"], "ODD": ODD, "CUDA_VISIBLE_DEVICES": "7", "SLURM_JOB_ID": "submitter's",
           "HOME": str(tmp_path)}
    script = run_sh(env, str(work), [sys.executable, "-c", SHOW, ODD])
    assert script is not None
    (tmp_path / "export X").write_text("")  # (a value's line that globs to a file's name is no variable)
    outer = {"PATH": os.environ["PATH"], "HOSTNAME": "login", "SECRET_OF_SBATCH": "x", "SLURM_JOB_ID": "42",
             "GLOB": "a\nexport *\nexport PATH2=1",
             "SLURM_PROCID": "0", "CUDA_VISIBLE_DEVICES": "0,1"}
    done = _start(tmp_path, script, outer, sh)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    got = {k: v for k, v in seen["env"].items() if k not in ("PWD", "SHLVL", "_", "LC_CTYPE")}
    # the attempt's own variables; the allocation's SLURM_* and GPUs win; nothing else of the batch job's
    assert got == {"PATH": os.environ["PATH"], "ODD": ODD, "HOME": str(tmp_path), "SLURM_JOB_ID": "42",
                   "SLURM_PROCID": "0", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert seen["cwd"] == str(work) and seen["argv"] == [ODD]
    assert seen["pgid"] is True  # its own process group: wrap.py's stop signals the whole of it
    assert seen["ign"] == []  # dash's `&` ignores INT and QUIT: put back for the program
    assert not Path("/tmp/h42-never").exists()


def test_a_gpu_variable_of_the_attempt_holds_where_the_allocation_sets_none(tmp_path: Path) -> None:
    script = run_sh({"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "3"}, str(tmp_path),
                    [sys.executable, "-c", SHOW])
    assert script is not None
    done = _start(tmp_path, script, {"PATH": os.environ["PATH"]})
    assert json.loads(done.stdout)["env"]["CUDA_VISIBLE_DEVICES"] == "3"


def test_the_fast_start_fails_like_wrap_py_on_a_missing_workdir_or_program(tmp_path: Path) -> None:
    script = run_sh({"PATH": os.environ["PATH"]}, str(tmp_path / "gone"), ["true"])
    assert script is not None
    done = _start(tmp_path, script, {"PATH": os.environ["PATH"]})
    assert done.returncode == 127 and "cannot run true: no directory" in done.stderr
    script = run_sh({"PATH": os.environ["PATH"]}, str(tmp_path), ["no-such-program-h42"])
    assert script is not None
    assert _start(tmp_path, script, {"PATH": os.environ["PATH"]}).returncode == 127


def test_no_fast_start_where_sh_cannot_name_a_variable() -> None:
    assert run_sh({"A-B": "1"}, "/tmp", ["true"]) is None  # wrap.py passes such names; sh cannot export them
    assert run_sh({"_ar_setsid": "1"}, "/tmp", ["true"]) is None  # the script's own
    assert run_sh({"SHELLOPTS": "braceexpand"}, "/tmp", ["true"]) is None  # bash (as sh) cannot export it
    assert run_sh({"A": "1"}, "/tmp", []) is None


def _request(tmp_path: Path, **more: object) -> LaunchRequest:
    (tmp_path / "run").mkdir(exist_ok=True)
    return LaunchRequest(key="1.1", argv=["python3", "train.py"], env={"PATH": "/usr/bin"}, workdir=str(tmp_path),
                         log_path=str(tmp_path / "log"), run_dir=str(tmp_path / "run"), **more)  # type: ignore[arg-type]


def test_the_batch_script_starts_the_program_before_python_and_hands_it_over(tmp_path: Path) -> None:
    backend = SlurmBackend(conf=str(tmp_path / "slurm.conf"))
    request = _request(tmp_path)
    argv = backend._prepare(request, "ar-1.1-x")
    script = Path(argv[-1]).read_text()
    assert (tmp_path / "run" / "run.sh").exists() and oct((tmp_path / "run" / "run.sh").stat().st_mode)[-3:] == "600"
    fork, hand = script.index('( . "$R/run.sh" ) &'), script.index('wrap.py" --child "$!"')
    assert fork < hand < script.index('exec "$PY" -I -S "$R/wrap.py" "$R"')  # the slow way stays as the fallback
    assert "train.py" not in script and "PATH" not in script  # Slurm keeps the script: no env, no argv in it


def test_a_gang_starts_from_sh_too_with_srun_and_its_members_prologue(tmp_path: Path) -> None:
    backend = SlurmBackend(conf=str(tmp_path / "slurm.conf"))
    argv = backend._prepare(_request(tmp_path, nodes=2), "ar-1.1-x")
    script, run = Path(argv[-1]).read_text(), (tmp_path / "run" / "run.sh").read_text()
    assert script.index("_ar_port=") < script.index('( . "$R/run.sh" ) &')
    assert 'wrap.py" --child "$!" "$R" "$_ar_addr" "$_ar_port"' in script and '[ -n "$_ar_port" ]' in script
    assert 'export MASTER_ADDR="$_ar_addr" MASTER_PORT="$_ar_port" WORLD_SIZE=2 LOCAL_WORLD_SIZE=1' in run
    assert "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 sh -c" in run and "autoresearch-member" in run


def test_the_scripts_master_port_skips_a_port_in_use_on_the_node(tmp_path: Path) -> None:
    """GANG_MASTER, run by sh: MASTER_ADDR is the first node's NodeAddr (the run dir's nodeaddrs, written
    from sinfo at submit; else a stand-in scontrol), and the port the first of the job's sequence that
    /proc/net/tcp does not list."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "NodeName=node-a Arch=x86_64 NodeAddr=10.1.2.3 NodeHostName=node-a"\n')
    (bin_dir / "scontrol").chmod(0o755)
    job = 4242
    first = 20000 + (job * 7919) % 20000
    script = f"R={tmp_path}\n" + "\n".join(GANG_MASTER) + '\necho "$_ar_addr $_ar_port"\n'
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": str(job), "SLURMD_NODENAME": "node-a"}

    def master() -> list[str]:
        return subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=60).stdout.split()

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first))
        busy.listen()
        assert master() == ["10.1.2.3", str(20000 + (job * 7919 + 7) % 20000)]
    assert master() == ["10.1.2.3", str(first)]
    (tmp_path / "nodeaddrs").write_text("node-0 10.9.9.9\nnode-a 10.4.4.4\n")
    (bin_dir / "scontrol").unlink()  # not asked
    assert master() == ["10.4.4.4", str(first)]


def test_pyxis_gang_members_set_their_ranks_inside_the_image(tmp_path: Path) -> None:
    backend = SlurmBackend(conf=str(tmp_path / "slurm.conf"), containers="pyxis")
    argv = backend._container(["python3", "train.py"], _request(tmp_path, nodes=2, image="nvcr.io/x:1"))
    assert argv[:2] == ["srun", "--nodes=2"] and "--container-image=nvcr.io/x:1" in argv
    tail = argv[argv.index("sh"):]
    assert tail == ["sh", "-c", MEMBER, "autoresearch-member", str(tmp_path / "run"), "python3", "train.py"]
    one = backend._container(["python3", "train.py"], _request(tmp_path, image="nvcr.io/x:1"))
    assert "sh" not in one  # one node: nothing to rank


@pytest.mark.parametrize(("code", "want"), [("sys.exit(3)", (3, None)), ("os.kill(os.getpid(), 9)", (None, 9)),
                                            ("pass", (0, None))])
def test_a_member_gets_its_ranks_and_records_how_it_ended(tmp_path: Path, code: str, want: tuple) -> None:
    program = f"import json, os, sys; print(json.dumps(dict(os.environ))); sys.stdout.flush(); {code}"
    env = {"PATH": os.environ["PATH"], "SLURM_PROCID": "1", "SLURM_NODEID": "1", "SLURM_LOCALID": "0",
           "SLURM_STEP_NUM_TASKS": "2", "SLURMD_NODENAME": 'n"1', "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    done = subprocess.run(member_argv(str(tmp_path), [sys.executable, "-c", program]), env=env, capture_output=True,
                          text=True, timeout=60)
    seen = json.loads(done.stdout.splitlines()[0])
    assert {k: seen[k] for k in ("RANK", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
        "RANK": "1", "NODE_RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    record = json.loads((tmp_path / "members" / "1.json").read_text())
    assert (record["exit_code"], record["signal"]) == want and record["rank"] == 1 and record["node"] == "n1"
    assert done.returncode == (want[0] if want[0] is not None else 128 + want[1])
    assert (first_failure(str(tmp_path)) is None) == (want == (0, None))


def test_a_member_whose_run_dir_is_not_there_still_runs(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")  # (inside an image the run dir may not exist: nothing can be made there)
    argv = member_argv(str(tmp_path / "a-file" / "run"), ["sh", "-c", "echo $RANK; exit 4"])
    done = subprocess.run(argv, env={"PATH": os.environ["PATH"], "SLURM_PROCID": "0"}, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (4, "0", "")


def test_the_supervisor_imports_only_what_a_one_node_attempt_needs(tmp_path: Path) -> None:
    """wrap.py starts beside the program (the fast start): hashlib, socket and subprocess (gangs only)
    wait until used, so its start takes less of the CPU the program's own start needs."""
    assert wrap.__file__

    (tmp_path / "request.json").write_text(json.dumps({"argv": ["true"], "workdir": str(tmp_path)}))
    (tmp_path / "env.json").write_text(json.dumps({"PATH": os.environ["PATH"]}))
    done = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", wrap.__file__, str(tmp_path)],
                          env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads((tmp_path / "exit.json").read_text())["exit_code"] == 0
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "json" in imported and not imported & {"hashlib", "socket", "subprocess"}


def test_a_started_programs_start_is_read_to_the_clock_tick(tmp_path: Path) -> None:
    from autoresearch.backends._slurm_wrap import started_at

    before = time.time()
    child = subprocess.Popen(["sleep", "5"])
    try:
        begun = started_at(child.pid)
    finally:
        child.kill()
        child.wait()
    assert begun is not None and before - 0.05 <= begun <= time.time()  # (a tick is 10 ms; btime was whole seconds)
    assert started_at(2**22 + 7) is None  # no such process


def test_a_program_our_stop_ended_before_wrap_py_took_it_over_ends_stopped(tmp_path: Path) -> None:
    """The fast start: scancel's SIGTERM can end the program the script started before ``wrap.py
    --child`` looks at stop.json; that ending is still our stop (a cancel), not the program's exit."""
    (tmp_path / "request.json").write_text(json.dumps({"argv": ["true"]}))
    (tmp_path / "stop.json").write_text(json.dumps({"requested_at": time.time()}))
    script = f'sh -c "exit 3" & exec {sys.executable} -I -S {wrap.__file__} --child "$!" {tmp_path}'
    subprocess.run(["/bin/sh", "-c", script], check=True, timeout=60)
    ending = json.loads((tmp_path / "exit.json").read_text())
    assert ending["exit_code"] == 3 and ending["stopped"] is True, ending


def test_a_program_that_exits_0_on_our_stops_sigterm_before_wrap_py_looks_ends_stopped(tmp_path: Path) -> None:
    """A program that handles SIGTERM and exits 0 (the conformance suite's graceful program): scancel's signal
    reaches it directly, and it can be gone before wrap.py looks at stop.json. Still our stop, exit code 0 kept."""
    (tmp_path / "request.json").write_text(json.dumps({"argv": ["true"]}))
    (tmp_path / "stop.json").write_text(json.dumps({"requested_at": time.time()}))
    script = f'sh -c "exit 0" & exec {sys.executable} -I -S {wrap.__file__} --child "$!" {tmp_path}'
    subprocess.run(["/bin/sh", "-c", script], check=True, timeout=60)
    ending = json.loads((tmp_path / "exit.json").read_text())
    assert ending["exit_code"] == 0 and ending["stopped"] is True, ending


def test_a_program_that_ended_before_our_stop_keeps_its_ending(tmp_path: Path) -> None:
    """A stop asked after the ending was recorded changes nothing: ``stop`` writes no stop.json then."""
    (tmp_path / "request.json").write_text(json.dumps({"argv": ["true"]}))
    script = f'sh -c "exit 0" & exec {sys.executable} -I -S {wrap.__file__} --child "$!" {tmp_path}'
    subprocess.run(["/bin/sh", "-c", script], check=True, timeout=60)
    SlurmBackend.__new__(SlurmBackend).stop(str(tmp_path))
    assert not (tmp_path / "stop.json").exists()
    ending = json.loads((tmp_path / "exit.json").read_text())
    assert ending["exit_code"] == 0 and ending["stopped"] is False, ending


def test_a_submit_lock_is_seen_held_by_whoever_holds_it(tmp_path: Path) -> None:
    """``held`` (util/_lockfile.py, shared with lock_holder): a Slurm attempt's submit.lock is held
    while a submit holds it, whether or not a pid is written in it; free after; none when missing."""
    from autoresearch.backends._slurm_files import locked
    from autoresearch.util._lockfile import held, lock_holder

    path = tmp_path / "submit.lock"
    assert held(path) is False  # no file: nobody
    with locked(str(path)):
        assert held(path) is True and lock_holder(path) is None  # held, no pid in it
        path.write_text("4242")
        assert lock_holder(path) == 4242
    assert held(path) is False and lock_holder(path) is None
