"""The command-line conventions people expect (issue 13): --version, completion, help on every
flag, global flags anywhere, ``--wait`` / ``logs -f`` exit statuses, filters that page, wide
tables when piped, a quiet closed pipe, ISO times in ``--json``."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch import __version__
from autoresearch.cli import build_parser
from autoresearch.cli.completion import commands, script
from tests.conftest import wait_for
from tests.runtime.test_cli import CLI, cli, status


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    parser = build_parser()
    return [("autoresearch", parser), *((f"autoresearch {n}", p) for n, p in commands(parser).items())]


def test_a_command_builds_its_own_parser_alone_and_it_is_the_whole_lines_one() -> None:
    """main() builds only the parser of the command it runs (the 27 cost ~10 ms of every start):
    each must be the one the whole command line has, with the same flags, help and handler."""
    whole = commands(build_parser())
    for name, full in whole.items():
        one = commands(build_parser(name))
        assert list(one) == [name]
        assert one[name].format_help() == full.format_help(), name
        assert one[name].get_default("handler") is full.get_default("handler") is not None, name
    assert sorted(commands(build_parser("no-such-command"))) == sorted(whole)  # argparse's error lists them all
    assert sorted(commands(build_parser(""))) == sorted(whole)


@pytest.mark.parametrize("args", [("--help", "status"), ("-h", "list"), ("--home", "h", "--help", "submit")])
def test_the_command_lines_help_lists_every_command_wherever_the_command_is(args: tuple[str, ...]) -> None:
    proc = cli(*args, check=False)
    assert proc.returncode == 0
    listed = proc.stdout.split("positional arguments:")[1].split("options:")[0]
    for name in commands(build_parser()):
        assert re.search(rf"^\s+{name}\s", listed, re.M), (name, listed)


def test_version_prints_the_package_version(home: Path) -> None:
    proc = cli("--version")
    assert proc.stdout.strip() == f"autoresearch {__version__}"


def test_every_flag_and_argument_has_help() -> None:
    missing = [f"{where} {'/'.join(a.option_strings) or a.dest}"
               for where, parser in all_parsers() for a in parser._actions
               if not isinstance(a, argparse._SubParsersAction) and (not a.help or a.help == argparse.SUPPRESS)]
    assert missing == [], f"flags without help text: {missing}"


def test_global_flags_work_after_the_command(home: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-home"
    cli("submit", "--home", str(other), "--", "true")  # after the command
    assert (other / "ledger.db").exists()
    assert json.loads(cli("list", "--json", "--home", str(other)).stdout)["jobs"][0]["id"] == 1
    assert json.loads(cli("--home", str(other), "list", "--json").stdout)["jobs"][0]["id"] == 1
    assert "Traceback" in cli("status", "999", "--debug", check=False).stderr  # --debug after the command
    assert "Traceback" not in cli("status", "999", check=False).stderr
    # `autoresearch --home H plan.yaml` is still the loop (not "invalid choice"): the plan is looked for
    proc = cli("--home", str(other), "missing-plan.yaml", check=False)
    assert proc.returncode == 2 and "missing-plan.yaml" in proc.stderr and "invalid choice" not in proc.stderr


def complete_in_bash(words: list[str], tmp_path: Path) -> list[str]:
    path = tmp_path / "completion.bash"
    path.write_text(cli("completion", "bash").stdout)
    quoted = " ".join(f"'{w}'" for w in words)
    program = (f"source {path}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _autoresearch; "
               "printf '%s\\n' \"${COMPREPLY[@]}\"")
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_bash_completion_completes_commands_flags_and_choices(home: Path, tmp_path: Path) -> None:
    assert {"submit", "status", "list", "logs", "completion"} <= set(complete_in_bash(["autoresearch", ""], tmp_path))
    assert complete_in_bash(["autoresearch", "li"], tmp_path) == ["list"]
    assert complete_in_bash(["autoresearch", "list", "--exp"], tmp_path) == ["--experiment"]
    assert complete_in_bash(["autoresearch", "--debug", "submit", "--wa"], tmp_path) == ["--wait"]
    assert set(complete_in_bash(["autoresearch", "completion", ""], tmp_path)) >= {"bash", "zsh", "fish"}


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_completion_name_every_command_and_flag(shell: str) -> None:
    parser = build_parser()
    text = script(parser, shell)
    for name, sub in commands(parser).items():
        assert re.search(rf"\b{name}\b", text), name
        for action in sub._actions:
            for flag in action.option_strings:
                if flag.startswith("--"):
                    assert (f"-l {flag[2:]}" if shell == "fish" else flag) in text, (name, flag)
    if shell == "fish":  # each subcommand comes with its help text
        assert "-a submit -d 'submit a job" in text
    else:
        assert text.startswith("#compdef autoresearch")


def test_submit_wait_and_logs_follow_exit_with_the_job_status(home: Path) -> None:
    failing = cli("submit", "--wait", "--", "/bin/sh", "-c", "echo working; sleep 0.5; exit 7", check=False)
    job = failing.stdout.strip()
    assert failing.returncode == 7 and status(job)["state"] == "failed"
    assert re.search(rf"^job {job} failed \(exit 7\)", failing.stderr.strip().splitlines()[-1])

    follow = cli("logs", job, "-f", check=False)
    assert follow.returncode == 7 and follow.stdout == "working\n"
    assert follow.stderr.strip().splitlines()[-1].startswith(f"job {job} failed (exit 7)")

    good = cli("submit", "--wait", "--json", "--", "true")
    view = json.loads(good.stdout)
    assert view["state"] == "succeeded" and good.stderr.strip().startswith(f"job {view['id']} succeeded")
    timed_out = cli("submit", "--wait", "--timeout", "1", "--", "sleep", "30", check=False)
    assert timed_out.returncode == 124 and "timeout" in timed_out.stderr


def test_list_experiment_matches_substrings_and_globs_and_the_hint_keeps_filters(home: Path) -> None:
    for experiment in ("digits-sweep", "Digits-v2", "cifar"):
        cli("submit", "--experiment", experiment, "--", "true")
    listed = json.loads(cli("list", "--experiment", "digits", "--json").stdout)
    assert [j["experiment"] for j in listed["jobs"]] == ["Digits-v2", "digits-sweep"]  # case-insensitive
    globbed = json.loads(cli("list", "--experiment", "*-v?", "--json").stdout)
    assert [j["experiment"] for j in globbed["jobs"]] == ["Digits-v2"]
    page = cli("list", "--experiment", "digits", "--limit", "1").stdout
    more = page.strip().splitlines()[-1]
    assert more == "more: autoresearch list --experiment digits --limit 1 --cursor 2"
    rest = json.loads(cli(*more.split()[2:], "--json").stdout)  # the hint as a command: the same filter
    assert [j["experiment"] for j in rest["jobs"]] == ["digits-sweep"] and rest["next_cursor"] is None


def test_piped_tables_are_not_cut_at_80_columns(home: Path) -> None:
    name = "a-rather-long-job-name-that-a-person-wants-to-read-in-full"
    cli("submit", "--name", name, "--experiment", "wide", "--", "true")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = cli("list", env=env).stdout  # captured: a pipe, not a terminal
    assert name in out and max(len(line) for line in out.splitlines()) > 80


def test_json_into_a_closed_pipe_ends_quietly(home: Path) -> None:
    for _ in range(3):
        cli("submit", "--", "true")
    proc = subprocess.Popen([*CLI, "list", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before anything is written (`| head` that already exited)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_json_times_have_iso_twins(home: Path) -> None:
    job = cli("submit", "--", "true").stdout.strip()
    wait_for(lambda: status(job)["state"] == "succeeded")
    view = status(job)
    for key in ("submitted_at", "started_at", "ended_at"):
        iso = view[f"{key}_iso"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", iso), iso
        assert time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(view[key]))) == iso
    assert view["attempt_list"][0]["ended_at_iso"] is not None


def test_cancel_json_returns_the_attempts_it_stopped(home: Path) -> None:
    job = cli("submit", "--", "sleep", "30").stdout.strip()
    wait_for(lambda: status(job)["state"] == "running")
    views = json.loads(cli("cancel", job, "--json").stdout)
    assert [a["n"] for a in views[0]["attempt_list"]] == [1]
    wait_for(lambda: status(job)["state"] == "cancelled")


def test_a_job_for_a_fully_cordoned_cluster_queues_with_a_warning(home: Path) -> None:
    node = json.loads(cli("nodes", "--json").stdout)["nodes"][0]["name"]
    cli("cordon", node, "--reason", "maintenance")
    sent = cli("submit", "--", "true")
    job = sent.stdout.strip()
    assert f"1 node cordoned ({node}: maintenance)" in sent.stderr and f"autoresearch uncordon {node}" in sent.stderr
    queued = status(job)
    assert queued["state"] == "queued" and any("no node can run this" in w for w in queued["warnings"])
    cli("uncordon", node)
    wait_for(lambda: status(job)["state"] == "succeeded")
    assert status(job)["warnings"] == []  # it ran: the warning is no longer true


def test_a_job_stopped_by_its_loop_is_listed_as_stopped(api: Any, home: Path) -> None:
    from autoresearch.engine import jobs

    job = api.submit({"command": ["sleep", "30"], "workdir": str(home.parent)})
    wait_for(lambda: api.status(job.id).state == "running")
    jobs.cancel(api._runtime, [job.id], reason="stopped")  # what the loop's early stopper does
    wait_for(lambda: api.status(job.id).state == "cancelled")
    line = next(row for row in cli("list").stdout.splitlines() if row.startswith(f"│ {job.id} "))
    assert "stopped" in line and "cancelled" not in line


def test_metrics_of_a_job_without_any_names_the_accepted_formats(home: Path) -> None:
    job = cli("submit", "--wait", "--", sys.executable, "-c", "print('hello')").stdout.strip()
    out = cli("metrics", job).stdout
    assert "no metrics reported yet" in out
    for shape in ("report(step=3, val_acc=0.95)", "val_acc=0.95 step=3", "epoch 3 val_acc: 0.95", "JSON"):
        assert shape in out, shape
