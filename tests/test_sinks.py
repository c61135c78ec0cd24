"""Where rows go: metrics.jsonl is the record (a row it cannot take stops the run), W&B and the progress bar are
best effort (a failure warns once and that sink drops out), and W&B keeps logging after a flush."""

import glob
import os

import pytest
import wandb
from helpers.wandb_log import history_and_summary

from ringexp import records
from ringexp.config import TrainConfig, plain
from ringexp.sinks import JsonlSink, Sinks, WandbSink


class Broken:
    """A best-effort sink whose every call fails, as W&B's would with its service gone."""
    best_effort = True

    def log(self, row, step):
        raise ConnectionError("service went away")

    summary = close = log


def test_a_failing_best_effort_sink_drops_out_and_training_records_go_on(tmp_path, capsys):
    sinks = Sinks([JsonlSink(tmp_path), Broken()])
    for step in (1, 2, 3):
        sinks.log({"train/loss": 1.0 / step}, step)
    sinks.summary({"status": "completed"})
    sinks.close()
    assert [r["step"] for r in records.read_rows(tmp_path)] == [1, 2, 3]
    warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("ringexp: warning:")]
    assert len(warnings) == 1 and "Broken stopped" in warnings[0] and "service went away" in warnings[0]


def test_a_row_metrics_jsonl_cannot_take_stops_the_run_naming_the_file(tmp_path):
    jsonl = JsonlSink(tmp_path)
    sinks = Sinks([jsonl])
    sinks.log({"train/loss": 0.5}, 1)
    jsonl.f.close()  # as a full or vanished disk would leave it
    with pytest.raises(RuntimeError, match=r"metrics.jsonl: cannot write the row of step 2"):
        sinks.log({"train/loss": 0.4}, 2)
    assert [r["step"] for r in records.read_rows(tmp_path)] == [1]


@pytest.fixture
def wandb_here():
    """W&B in this (pytest's) process: afterwards its service is torn down and the environment restored, or every
    later run of the CLI would inherit WANDB_SERVICE and log through this process's service."""
    environ = dict(os.environ)
    yield
    wandb.teardown()
    os.environ.clear()
    os.environ.update(environ)


def test_wandb_keeps_logging_after_a_flush(tmp_path, wandb_here):
    """summary() and artifact() wait for the queued rows; rows logged after them must reach the run too."""
    meta = {"name": "flush", "group": "flush", "job_type": "test", "choices": {}}
    sink = WandbSink.open(plain(TrainConfig()), tmp_path, meta)
    assert sink is not None
    for step in (1, 2, 3):
        sink.log({"train/loss": 1.0 / step}, step)
    sink.summary({"status": "running"})  # flushes
    for step in (4, 5):
        sink.log({"train/loss": 1.0 / step}, step)
    sink.close()
    history, summary, _ = history_and_summary(glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "*.wandb"))[0])
    assert [h["_step"] for h in history] == [1, 2, 3, 4, 5]
    assert summary["status"] == "running"


def test_metrics_jsonl_reader_drops_a_line_cut_short(tmp_path):
    (tmp_path / records.METRICS).write_text('{"step": 1, "train/loss": 0.5}\n{"step": 2, "train/loss": 0.4}\n'
                                            '{"step": 3, "train/lo')
    assert [r["step"] for r in records.read_rows(tmp_path)] == [1, 2]
