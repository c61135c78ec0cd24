"""Inject every fault of issue 7 several times and tabulate: tries, recoveries as specified, worst time from
the fault to the job's exit, anything lost. Each trial is the corresponding test's own check, so "recovered"
means every assertion of that test held. Usage: .venv/bin/python scripts/fault_trials.py [TRIALS] [--slurm]"""

import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import conftest as ct  # noqa: E402
import test_survive as ts  # noqa: E402


def main():
    trials = int(next((a for a in sys.argv[1:] if a.isdigit()), 3))
    refs = ct.reference_losses(lambda: Path(tempfile.mkdtemp(prefix="ref-")))
    faults = {f"SIGKILL {kill} of {preset}" + (", then resume=auto" if resume else ""):
              (lambda p=preset, k=kill, r=resume: ct.kill_and_resume(Path(tempfile.mkdtemp()) / "run", p, k, r, refs))
              for preset, kill, resume in ct.KILL_CASES}
    faults |= {
        "SIGKILL rank 1 under launcher.max_restarts=1": lambda: ts.test_max_restarts_restarts_the_workers_and_finishes_from_the_checkpoint(Path(tempfile.mkdtemp())),  # noqa: E501
        "NaN loss": lambda: ts.test_nan_loss_stops_the_run_naming_step_and_rank(Path(tempfile.mkdtemp())),
        "NaN/inf under fp16 GradScaler": lambda: ts.test_fp16_grad_scaler_skips_non_finite_steps_and_counts_them(Path(tempfile.mkdtemp())),  # noqa: E501
        "corrupt images (stop / skip_bad)": lambda: ts.test_corrupt_image_is_named_or_skipped_and_counted(Path(tempfile.mkdtemp()), ct.make_image_folder(Path(tempfile.mkdtemp()) / "images")),  # noqa: E501
        "W&B online unreachable + bad key": lambda: ts.test_wandb_online_out_of_reach_falls_back_to_offline_and_never_records_the_key(Path(tempfile.mkdtemp())),  # noqa: E501
        "incompatible checkpoint": lambda: ts.test_incompatible_checkpoint_is_one_line_naming_the_mismatch(Path(tempfile.mkdtemp())),  # noqa: E501
    }

    def disk_full():
        tmp = Path(tempfile.mkdtemp(prefix="disk-"))
        with ts.small_disk(tmp / "run") as run_dir:
            ts.test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp, run_dir)

    faults["disk full while checkpointing"] = disk_full
    if "--slurm" in sys.argv:
        import subprocess

        import test_slurm

        subprocess.run([str(ct.ROOT / "scripts/slurm_local.sh"), "up"], check=True, capture_output=True)
        env = {**__import__("os").environ, "SLURM_CONF": "/tmp/ringexp-slurm/slurm.conf"}
        faults["Slurm pre-emption (USR2), requeue"] = lambda: test_slurm.test_a_preempted_slurm_job_requeues_and_resumes_from_its_checkpoint(Path(tempfile.mkdtemp()), env)  # noqa: E501

    print("| fault | tries | recovered as specified | worst time to exit (s) | worst trial (s) | failures |")
    print("|---|---|---|---|---|---|")
    for name, fn in faults.items():
        ok, exits, walls, errors = 0, [], [], []
        for _ in range(trials):
            t = time.monotonic()
            try:
                took = fn()
                ok += 1
                if isinstance(took, float):
                    exits.append(took)
            except Exception as e:  # noqa: BLE001 - a failed trial is a result, not a crash of the script
                errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
                traceback.print_exc(file=sys.stderr)
            walls.append(time.monotonic() - t)
        exit_s = f"{max(exits):.1f}" if exits else "-"
        print(f"| {name} | {trials} | {ok} | {exit_s} | {max(walls):.0f} | {'; '.join(errors) or '-'} |", flush=True)


if __name__ == "__main__":
    main()
