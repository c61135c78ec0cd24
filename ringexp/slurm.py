"""Sweeps through `hydra/launcher=slurm` (hydra-submitit-launcher) when a task of a job is killed.

A job of several tasks (one per rank) whose task was killed (SIGKILL, the OOM killer, its node lost) leaves no
result file for that task. submitit's Job.results then raises UncompletedJobError out of the launcher, and so out
of the whole sweep, with a traceback; the sweep's later jobs are neither waited for nor reported. ringexp's ranks
report their own failures (every surviving rank prints one line naming the rank that went silent, rank 0 writes
the run's summary.json), so a sweep needs one task's answer, not all of them. `KilledTasks`, a Hydra callback in
conf/train.yaml, makes the launcher take the first task that gave one (and where rank 0 itself left none, writes
the failure into the run directory) for as long as a Slurm sweep runs. The launcher is a Hydra plugin, which only
code in the hydra_plugins package may replace, so this swaps submitit's Job.results instead. submitit learns that
a killed task has ended from sacct: the cluster needs Slurm's accounting (scripts/slurm_local.sh and
cluster_local.sh start it).
"""

from pathlib import Path

from hydra.experimental.callback import Callback

from ringexp import records


class KilledTasks(Callback):
    def on_multirun_start(self, config, **kwargs) -> None:
        if on_slurm(config):
            from submitit.slurm.slurm import SlurmJob  # only with the Slurm launcher (an optional extra)
            SlurmJob.results = first_answer

    def on_multirun_end(self, config, **kwargs) -> None:
        if on_slurm(config):
            from submitit.slurm.slurm import SlurmJob
            del SlurmJob.results  # submitit's own again (SlurmJob inherits it from Job)


def on_slurm(config) -> bool:
    return str(config.hydra.launcher.get("_target_", "")).endswith("submitit_launcher.SlurmLauncher")


def first_answer(job) -> list:
    """[the first task's result that exists] for a job of several tasks: a task that left none is reported, not
    raised, while another task answered. A task that raised still raises, as in submitit."""
    from submitit.core.core import Job  # its results(), not this one
    from submitit.core.utils import UncompletedJobError
    results = Job.results
    if job.num_tasks <= 1:
        return results(job)
    answers, lost = [], []
    for task in range(job.num_tasks):
        sub = job.task(task)
        if answers and not sub.paths.result_pickle.exists():
            # the job has ended and a task answered: one without a result now has none (submitit would wait 15 s
            # for it, as for a slow filesystem; task 0, read first, still gets that wait)
            lost.append((task, f"Job {job.job_id} (task: {task}) has not produced any output"))
            continue
        try:
            answers.append(results(sub)[0])
        except UncompletedJobError as e:
            lost.append((task, str(e).splitlines()[0]))
    if not answers:
        raise UncompletedJobError(f"no task of Slurm job {job.job_id} left a result: {lost[0][1]}")
    if lost and lost[0][0] == 0:  # rank 0 writes summary.json; it was killed before it could say so
        records.mark_failed(Path(answers[0].working_dir), f"rank 0 (Slurm task 0 of job {job.job_id}) was killed "
                            f"without a word: {lost[0][1]}; the other ranks' lines are in their logs")
    return answers[:1]
