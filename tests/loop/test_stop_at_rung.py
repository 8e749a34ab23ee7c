"""Stop at the rung, not after it (issue 15 item 4): a trial's report() at a rung pokes the loop and
waits for its verdict, so a stopped trial's last reported step is the rung it was judged at."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan

# a loss of x + 1/step, one step every `pause` seconds; `work` runs on after the step (an epoch's tail)
TRIAL = textwrap.dedent("""\
    import sys, time
    from autoresearch import report
    x, steps, pause = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    for step in range(1, steps + 1):
        time.sleep(pause)
        report(step=step, other=1.0)  # another metric first: no wait for it
        report(step=step, loss=x + 1.0 / step)
""")


@pytest.fixture
def work(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")
    (tmp_path / "trial.py").write_text(TRIAL)
    return tmp_path


def last_steps(api: Any, job_id: int) -> int:
    return int(api._ledger.query("SELECT max(step) AS s FROM metrics WHERE job_id=? AND name='loss'",
                                 (job_id,))[0]["s"])


def test_stopped_trials_train_no_step_past_their_rung(api: Any, work: Path) -> None:
    plan = parse_plan({
        "name": "rung", "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} trial.py {{x}} 20 0.1", "grace": 5},
        "space": {"x": {"choices": [0.0, 0.2, 5.0, 6.0, 7.0]}}, "proposer": {"kind": "grid"},
        "budget": {"trials": 5, "parallel": 1},
        "early_stop": {"kind": "asha", "min_steps": 2, "reduction_factor": 2}}, base_dir=work)
    # the default 0.5 s monitor: without the handshake a trial reporting every 0.1 s runs on for steps
    view = Controller(plan, runtime=api._runtime).run()
    stops = {d["trial_id"]: json.loads(d["inputs"]) for d in
             api._ledger.query("SELECT * FROM decisions WHERE kind='stop'", ())}
    stopped = [t for t in view.trials if t.state == "stopped"]
    assert len(stopped) >= 2 and set(stops) == {t.trial_id for t in stopped}
    for t in stopped:
        assert t.job_id is not None
        assert last_steps(api, t.job_id) == stops[t.trial_id]["step"], (t.params, stops[t.trial_id])
    assert not list((api._ledger.home / "loops" / "rung" / "verdicts").iterdir())  # answered and cleaned up


def test_report_does_not_wait_without_a_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    R = importlib.import_module("autoresearch.report")

    fifo, verdict = tmp_path / "wake.fifo", tmp_path / "verdict"
    os.mkfifo(fifo)
    verdict.write_text("")
    monkeypatch.setattr(R, "_sync_read", False)
    monkeypatch.setenv("AUTORESEARCH_METRICS_FILE", str(tmp_path / "m.jsonl"))
    for key, value in {"STEPS": "3,9", "FILE": str(verdict), "FIFO": str(fifo), "WAIT_S": "30",
                       "METRIC": "loss"}.items():
        monkeypatch.setenv(f"AUTORESEARCH_STOP_{key}", value)
    t0 = time.monotonic()
    R.report(step=3, loss=1.0)  # nobody reads the FIFO: no controller, no wait
    assert time.monotonic() - t0 < 15  # a wait would last WAIT_S (30 s); slack for a loaded machine
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        verdict.write_text("3")
        R.report(step=3, loss=1.0)  # answered already
        assert os.read(reader, 16) == b"r"  # the loop was poked
        R.report(step=4, loss=1.0)  # not a rung: no poke
        assert os.read(reader, 16) == b""
    finally:
        os.close(reader)
    assert time.monotonic() - t0 < 25


STOPPED_AT_THE_RUNG = textwrap.dedent("""\
    import os, sys
    from autoresearch import report
    reader = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)  # a controller listens
    report(step=3, loss=1.0)
    print("trained on", flush=True)
""")


def _at_the_rung(tmp_path: Path, answer: str, wait_s: int = 30) -> tuple[list[str], dict[str, str]]:
    """The trial's command and environment: step 3 is a rung, a controller listens on the FIFO and
    its verdict file already says ``answer``; a trial waits at most ``wait_s`` for it."""
    fifo, verdict = tmp_path / "wake.fifo", tmp_path / "verdict"
    os.mkfifo(fifo)
    verdict.write_text(answer)
    env = {**os.environ, "AUTORESEARCH_METRICS_FILE": str(tmp_path / "m.jsonl"), "AUTORESEARCH_STOP_STEPS": "3",
           "AUTORESEARCH_STOP_FILE": str(verdict), "AUTORESEARCH_STOP_FIFO": str(fifo),
           "AUTORESEARCH_STOP_WAIT_S": str(wait_s), "AUTORESEARCH_STOP_METRIC": "loss"}
    return [sys.executable, "-c", STOPPED_AT_THE_RUNG, str(fifo)], env


def test_a_trial_told_to_stop_at_its_rung_waits_there_for_its_sigterm(tmp_path: Path) -> None:
    """The verdict "3 stop" is written after the cancel, but the SIGTERM reaches the trial through its
    supervisor, later on a loaded machine: report() returned and the trial trained another step
    meanwhile (a paused trial checkpointed past its rung). Now it waits for the signal there."""
    import signal
    import subprocess

    argv, env = _at_the_rung(tmp_path, "3 stop")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                            text=True)
    try:
        time.sleep(2.0)  # (the old report() returned at once: "trained on" long before this)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM and "trained on" not in out, (proc.returncode, out)


def test_a_trial_told_to_go_on_goes_on_at_once(tmp_path: Path) -> None:
    import subprocess

    argv, env = _at_the_rung(tmp_path, "3", wait_s=900)
    done = subprocess.run(argv, env=env, capture_output=True,
                          text=True, timeout=300)  # a wait would last 900 s; a loaded machine's start, not 25
    assert done.returncode == 0 and "trained on" in done.stdout, done


# the same trial printing its objective (a documented log format: 'epoch N name: value') instead of report()
PRINTED = textwrap.dedent("""\
    import sys, time
    x, steps, pause = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    for step in range(1, steps + 1):
        time.sleep(pause)
        print(f"epoch {step} other: 1.0", flush=True)  # another metric at the rung: no hold for it
        print(f"epoch {step} loss: {x + 1.0 / step}", flush=True)
""")


def test_trials_that_print_their_metric_stop_at_their_rung_too(api: Any, work: Path) -> None:
    """A trial's printed lines went to its log unseen until the loop's next look (0.5 s): stopped
    trials ran on for epochs past the rung their stop decision names. Their supervisor now holds
    them (SIGSTOP) at a printed rung line until the loop's verdict."""
    (work / "printed.py").write_text(PRINTED)
    plan = parse_plan({
        "name": "printed", "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} printed.py {{x}} 20 0.1", "grace": 5},
        "space": {"x": {"choices": [0.0, 0.2, 5.0, 6.0, 7.0]}}, "proposer": {"kind": "grid"},
        "budget": {"trials": 5, "parallel": 1},
        "early_stop": {"kind": "asha", "min_steps": 2, "reduction_factor": 2}}, base_dir=work)
    view = Controller(plan, runtime=api._runtime).run()
    stops = {d["trial_id"]: json.loads(d["inputs"]) for d in
             api._ledger.query("SELECT * FROM decisions WHERE kind='stop'", ())}
    stopped = [t for t in view.trials if t.state == "stopped"]
    assert len(stopped) >= 2 and set(stops) == {t.trial_id for t in stopped}
    for t in stopped:
        assert t.job_id is not None
        assert last_steps(api, t.job_id) == stops[t.trial_id]["step"], (t.params, stops[t.trial_id])
    ok = [t for t in view.trials if t.state == "succeeded"]
    assert ok and all(t.job_id is not None and last_steps(api, t.job_id) == 20 for t in ok)  # held, then let go


def test_the_supervisor_finds_rung_lines_in_any_chunking() -> None:
    from autoresearch.backends._supervisor import _Rungs

    rungs = _Rungs(frozenset({2, 4}), "loss", "/nonexistent", "/nonexistent", 5.0)
    assert rungs.scan(b"epoch 1 loss: 6.0\nepoch 2 loss: 3\n") == 2
    assert rungs.scan(b"epoch 4 lo") is None and rungs.scan(b"ss: 1\n") == 4  # a line split across reads
    assert rungs.scan(b"epoch 4 val_loss: 3\nepoch 4 loss: nan\nloss: 1\n") is None  # another name, no value, no step
    assert rungs.scan(b'{"step": 4, "loss": 0.5}\n') == 4  # a JSON line
    assert rungs.scan(b"\xff" * 100_000 + b"loss" * 1000 + b"\n") is None  # garbage, a huge line
    assert rungs.scan(b"epoch 99999999999999999999 loss: 1\n<b>epoch 2 loss: 1</b>\n") is None
    rungs.hold(2, 0.0)  # no FIFO: nobody to wait for
    assert rungs.verdict(0.0) and rungs.held is None
    assert rungs.scan(b"epoch 2 loss: 1\n") is None  # the rung held at already
    assert _Rungs.from_env({"AUTORESEARCH_STOP_STEPS": "x"}) is None
    assert _Rungs.from_env({"AUTORESEARCH_STOP_STEPS": "3", "AUTORESEARCH_STOP_FILE": "f", "AUTORESEARCH_STOP_FIFO": "p",
                            "AUTORESEARCH_STOP_METRIC": "loss", "AUTORESEARCH_STOP_WAIT_S": "nan"}) is None


def test_one_rung_protocol_for_report_and_the_supervisor(tmp_path: Path) -> None:
    """report() and the supervisor's _Rungs poke the loop and read its verdict with the same two
    functions: a FIFO nobody reads is no listener, a file of garbage is no answer yet."""
    from autoresearch.backends._supervisor import _rung_protocol
    from autoresearch.report import _answer, _poke

    assert _rung_protocol() == (_poke, _answer)
    fifo, plain = tmp_path / "fifo", tmp_path / "plain"
    os.mkfifo(fifo)
    plain.write_text("")
    assert not _poke(str(fifo)) and not _poke(str(plain)) and not _poke(str(tmp_path / "missing"))
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert _poke(str(fifo)) and os.read(reader, 8) == b"r"
    finally:
        os.close(reader)
    answers = tmp_path / "answer"
    assert _answer(str(answers), 3) is None  # not visible here: nobody to wait for
    for text, verdict in ((b"", ""), (b"2", ""), (b"3", "go"), (b"4 stop", "stop"), (b"3 stop", "stop"),
                          ("\u00b2".encode(), ""), (b"\xff\xfe 3", ""), (b"x" * 100, "")):
        answers.write_bytes(text)
        assert _answer(str(answers), 3) == verdict, text


# the first wave: `n` trials start together (each waits, at most 60 s, until all n have started), so all
# reach the first rung before any goes past it; then they print a loss of x + 1/step every `pause` s
BARRIER = textwrap.dedent("""\
    import os, sys, time
    x, steps, pause, n = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    open(f"ready-{x}", "w").close()
    deadline = time.time() + 60
    while sum(name.startswith("ready-") for name in os.listdir(".")) < n and time.time() < deadline:
        time.sleep(0.02)
    for step in range(1, steps + 1):
        time.sleep(pause)
        print(f"epoch {step} loss: {x + 1.0 / step}", flush=True)
""")


def _first_wave(api: Any, work: Path, name: str, epochs: int) -> tuple[Any, dict[int, Any]]:
    (work / "barrier.py").write_text(BARRIER)
    plan = parse_plan({
        "name": name, "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} barrier.py {{x}} {epochs} 0.3 3", "grace": 5},
        "space": {"x": {"choices": [0.0, 5.0, 6.0]}}, "proposer": {"kind": "grid"},
        "budget": {"trials": 3, "parallel": 3},
        "early_stop": {"kind": "asha", "min_steps": 2, "reduction_factor": 2}}, base_dir=work)
    view = Controller(plan, runtime=api._runtime).run()
    stops = {d["trial_id"]: json.loads(d["inputs"]) for d in
             api._ledger.query("SELECT * FROM decisions WHERE kind='stop'", ())}
    return view, stops


def test_the_first_wave_stops_at_its_rung_too(api: Any, work: Path) -> None:
    """Without max_steps a rung is judged once some trial went past it (it may be the last epoch). In
    the first wave nobody had: every trial went on, and the losers were stopped a step past their
    rung. Now the best of them goes on (kept) and the others wait at the rung to be judged there."""
    view, stops = _first_wave(api, work, "wave", 8)
    stopped = [t for t in view.trials if t.state == "stopped"]
    assert stopped and set(stops) == {t.trial_id for t in stopped}
    for t in stopped:
        assert t.job_id is not None
        assert last_steps(api, t.job_id) == stops[t.trial_id]["step"], (t.params, stops[t.trial_id])
    worst = next(t for t in view.trials if t.params["x"] == 6.0)
    assert worst.state == "stopped" and stops[worst.trial_id]["step"] == 2  # at the first-wave rung
    best = next(t for t in view.trials if t.params["x"] == 0.0)
    assert best.state == "succeeded" and best.job_id is not None and last_steps(api, best.job_id) == 8


def test_a_first_wave_rung_that_is_the_last_epoch_stops_nobody(api: Any, work: Path) -> None:
    """The reason a rung waits for a trial to go past it: the rung may be the trials' last epoch. The
    lead finishes there; the ones waiting at the rung are then let go unjudged and finish too."""
    view, stops = _first_wave(api, work, "short", 2)
    assert not stops and [t.state for t in view.trials] == ["succeeded"] * 3
