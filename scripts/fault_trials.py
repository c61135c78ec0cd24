"""Inject every fault of issue 7 several times and tabulate: tries, recoveries as specified, the worst trial's time,
what went wrong. Each trial is the corresponding test, run by pytest in a subprocess, so "recovered" means every
assertion of that test held (how soon the job exits after the fault is one of them: a killed worker's job within
tests/helpers/runs.py's EXIT_WITHIN_S). Usage: .venv/bin/python scripts/fault_trials.py [TRIALS] [--slurm]
(TRIALS default 3; --slurm adds Slurm pre-emption, on the one-node Slurm of scripts/slurm_local.sh, which the
test starts itself). pytest's own report goes to stderr, the table to stdout."""

import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# fault: the test that injects it (every case of a parametrized test: one row per case, named by KILLED)
FAULTS = {
    "SIGKILL": "tests/test_resume.py::test_killed_run_resumes_with_the_same_losses",
    "SIGKILL rank 1 under launcher.max_restarts=1":
        "tests/test_survive.py::test_max_restarts_restarts_the_workers_and_finishes_from_the_checkpoint",
    "NaN loss": "tests/test_survive.py::test_nan_loss_stops_the_run_naming_step_and_rank",
    "NaN/inf under fp16 GradScaler":
        "tests/test_survive.py::test_fp16_grad_scaler_skips_non_finite_steps_and_counts_them",
    "corrupt images (stop / skip_bad)":
        "tests/test_hostile.py::test_a_decompression_bomb_is_named_or_skipped_and_unreadable_validation_images_count",
    "W&B online unreachable + bad key":
        "tests/test_survive.py::test_wandb_online_out_of_reach_falls_back_to_offline_and_never_records_the_key",
    "incompatible checkpoint": "tests/test_survive.py::test_incompatible_checkpoint_is_one_line_naming_the_mismatch",
    "disk full while checkpointing":
        "tests/test_survive.py::test_disk_full_while_checkpointing_keeps_the_previous_checkpoint",
}
SLURM = {"Slurm pre-emption (USR2), requeue":
         "tests/test_slurm.py::test_a_preempted_slurm_job_requeues_and_resumes_from_its_checkpoint"}
KILLED = re.compile(r"\[(?P<preset>.+)-(?P<kill>rank\d+|job)-(?P<resume>True|False)\]$")  # test_resume's cases


def fault_name(faults: dict, testcase: ET.Element) -> tuple:
    """(fault, row) of a JUnit testcase: its fault, and the row's name (a kill case: its preset, what was killed,
    and whether it resumed)."""
    test = testcase.get("name", "")
    fault = next((f for f, node in faults.items() if node.rsplit("::", 1)[1] == test.split("[")[0]), test)
    if fault == "SIGKILL" and (m := KILLED.search(test)):
        return fault, f"SIGKILL {m['kill']} of {m['preset']}" + (", then resume=auto" if m["resume"] == "True" else "")
    return fault, fault


def trial(faults: dict, report: Path) -> list:
    """One pytest run of every fault's test: [(row, outcome, seconds, why)], outcome passed, failed or skipped; a
    fault whose test did not run (pytest could not find or collect it) failed."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", f"--junitxml={report}",
           *faults.values()]
    done = subprocess.run(cmd, cwd=ROOT, stdout=sys.stderr, stderr=sys.stderr)
    out, ran = [], set()
    for case in ET.parse(report).getroot().iter("testcase") if report.is_file() else []:
        bad = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        fault, row = fault_name(faults, case)
        ran.add(fault)
        outcome = "passed" if bad is None else "skipped" if bad.tag == "skipped" else "failed"
        out.append((row, outcome, float(case.get("time") or 0.0), why(bad)))
    return out + [(f, "failed", 0.0, f"not run (pytest exited {done.returncode}; its report is on stderr)")
                  for f in faults if f not in ran]


def why(bad) -> str:
    """A failed, erred or skipped testcase's reason, in one short line."""
    if bad is None:
        return ""
    text = (bad.get("message") or "").strip() or (bad.text or "").strip() or bad.tag
    return f"{bad.tag}: {text.splitlines()[0][:120]}" if bad.tag != "failure" else text.splitlines()[0][:120]


def table(results: dict) -> str:
    lines = ["| fault | tries | recovered as specified | skipped | worst trial (s) | failures |",
             "|---|---|---|---|---|---|"]
    for name, got in results.items():
        ok = sum(outcome == "passed" for outcome, _, _ in got)
        skipped = sum(outcome == "skipped" for outcome, _, _ in got)
        # each reason once, and no | of a message to break the table
        whys = "; ".join(dict.fromkeys(r.replace("|", "/") for outcome, _, r in got if outcome != "passed")) or "-"
        lines.append(f"| {name} | {len(got)} | {ok} | {skipped} | {max(t for _, t, _ in got):.0f} | "
                     f"{whys} |")
    return "\n".join(lines)


def main(argv) -> int:
    unknown = [a for a in argv if not a.isdigit() and a != "--slurm"]
    if unknown:
        print(f"fault_trials: unknown argument {unknown[0]} (usage: scripts/fault_trials.py [TRIALS] [--slurm])",
              file=sys.stderr)
        return 2
    trials = int(next((a for a in argv if a.isdigit()), 3))
    faults = FAULTS | (SLURM if "--slurm" in argv else {})
    results = {}
    with tempfile.TemporaryDirectory(prefix="fault-trials-") as tmp:
        for i in range(trials):
            print(f"fault_trials: trial {i + 1} of {trials}", file=sys.stderr, flush=True)
            for fault, outcome, seconds, reason in trial(faults, Path(tmp) / f"trial{i}.xml"):
                results.setdefault(fault, []).append((outcome, seconds, reason))
    print(table(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
