"""`python -m ringexp.compare PATH...`: the runs of one or more sweeps as one table and a few plots.

PATHs are sweep directories or run directories (anything holding `summary.json` files below it), from local
or Slurm runs; `--wandb ENTITY/PROJECT --group NAME` reads the same numbers from the W&B API instead. One
row per run: the overrides that differ between the runs, median throughput with its p10-p90 spread, the
speed-up against a baseline row (`--baseline TEXT`: the first row whose label contains TEXT; default: the
`ddp` row, else the first), the step time split, bytes per step, final/best macro-AUROC and F1, peak memory.
Failed runs are listed with their error; a run whose records cannot be used (a file that is not a run's record, a
FIFO, a symlink, a summary lacking or mistyping what the table reads) as unreadable, with the file and why, and
the other runs are reported as before. Every file compare writes replaces what is at its name (records.write_file):
a symlink planted there is replaced, never written through. Every sweep of `ringexp.train -m` ends with this report
written into its directory (`SweepReport`, a Hydra callback), so the numbers are there even with W&B offline.

Seed groups (ringexp.verdicts.groups; always where a group has several seeds, else with `--groups`): the completed
runs whose overrides are the same but for `seed=` (a run without one has the schema's default seed), of the baseline
group's task and code versions, one per seed (ringexp.verdicts.members; every other run with those overrides is named
as left out, with why), one row each with the mean and sample standard deviation over its runs, the speed-up of its
mean whole-run throughput and its time to each eval.targets macro-AUROC against the group holding the baseline row
(a ratio only where every seed reached it), and its quality verdict against that group (ringexp.quality:
*equivalent*, *better*, *worse*, *not equivalent* or *inconclusive*, with the interval it was decided on;
`--quality-budget` and `--f1-budget`, by default ringexp.quality.MARGIN and F1_MARGIN, are the margins; the quality
column is the decision over final macro-AUROC and macro-F1, equivalent only where both are): over the seeds both
share when they share two or more, else on the validation set from one run of each, which is labelled *one seed
(indicative)*: it leaves out the seeds' variance. The table goes into compare.md, its numbers into groups.csv and
the verdicts into quality.json (what the planner's `predict` reads); with `--wandb` each run's verdict goes into its
W&B summary too. `--fastest CHOICE` prints only the value of choice CHOICE (summary `choices`, e.g. `parallel`) of
the group with the highest mean throughput, for a shell script to use; it writes nothing.

This module is the command: its flags (main), the report it writes (report), the seed groups' verdicts in the
report and in W&B, and the sweep's Hydra callback (SweepReport). The runs are read by ringexp.verdicts.load, made
a table by ringexp.compare.table and written by ringexp.compare.render.
"""

import argparse
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from ringexp import quality, records
from ringexp.compare.render import markdown, plots, text, write_csv
from ringexp.compare.table import table
from ringexp.errors import print_error, print_warning
from ringexp.verdicts import groups as seeds
from ringexp.verdicts.load import load_local, load_wandb, printable_path

OUTPUTS = ("compare.md", "compare.csv", "throughput.png", "auroc.png", "comm_share.png")
GROUP_OUTPUTS = ("groups.csv", seeds.QUALITY_FILE)  # with seed groups


def report(runs, out: Path | None, baseline: str | None = None, groups: bool | None = None, clusters=(),
           margin: float = quality.MARGIN, f1_margin: float = quality.F1_MARGIN, family: int | None = None) -> str:
    """Write compare.md, compare.csv and the plots into `out` (if given), and with seed groups (`groups`; None:
    where a group has several seeds) groups.csv and quality.json; return the terminal table (then the groups')."""
    return reported(runs, out, baseline, groups, clusters, margin, f1_margin, family)[0]


def reported(runs, out: Path | None, baseline: str | None, groups: bool | None, clusters, margin: float,
             f1_margin: float = quality.F1_MARGIN, family: int | None = None) -> tuple:
    """report()'s (text, the seed groups' Report or None)."""
    rows, failed, base = table(runs, baseline, clusters)
    judged = judge_groups(runs, rows, base, margin, f1_margin, family) if rows and groups is not False else None
    if judged is not None and groups is None and all(r["seeds"] < 2 for r in judged.rows):
        judged = None
    if judged is not None:
        words = {id(run): "left out" for row in judged.rows for run, _, _ in row["_left_out"]}
        words |= {id(run): row["quality"] for row in judged.rows for run in row["_runs"]}
        for r in rows:
            r["quality"] = words.get(id(r["_run"]))
    if out is not None:
        # the directory the user named (the sweep's by default) may be a link they made; every file written in it
        # goes through records.write_file, which replaces a symlink planted at its name instead of following it
        out.mkdir(parents=True, exist_ok=True)
        records.write_file(out / "compare.md", markdown(rows, failed, base)
                           + (f"\nSeed groups:\n\n{judged.markdown()}" if judged else ""))
        write_csv(rows, failed, out / "compare.csv")
        if rows:
            plots(runs, rows, out)
        if judged is not None:
            judged.write(out)
    if judged is not None and any("api" in run for run in runs):
        to_wandb(judged)
    return text(rows, failed, base) + (f"\nSeed groups:\n{judged.text()}" if judged else ""), judged


def judge_groups(runs, rows, base: int, margin: float, f1_margin: float = quality.F1_MARGIN,
                 family: int | None = None):
    """The seed groups' report against the group that holds the baseline row (each row's `_runs`, the runs in its
    numbers and verdict, and `_left_out` serve the per-run quality column and W&B), each test at quality.ALPHA
    over `family` (None: the groups beside the baseline's, any of which a choice among them could take)."""
    groups = seeds.seed_groups(runs)
    family = family or max(1, len(groups) - 1)
    return seeds.report(groups, seeds.group_of(groups, rows[base]["_run"]), margin, quality.ALPHA / family,
                        margins=seeds.margins_of(margin, f1_margin), family=family)


def to_wandb(judged) -> None:
    """Each W&B run's group verdict into its W&B summary (compare --wandb): quality/* keys."""
    for row in judged.rows:
        head = row["_verdicts"].get(row.get("decided on"))  # (the verdict the quality column's decision took)
        keys = {"quality/verdict": row["quality"], "quality/group": row["group"]}
        if head is not None:
            (lo, hi), level = head.decided_on()
            keys |= {"quality/diff": head.diff, "quality/ci_low": lo, "quality/ci_high": hi, "quality/ci_level": level,
                     "quality/margin": head.margin, "quality/test": head.test, "quality/seeds": head.seeds}
        for run in row["_runs"]:
            if "api" in run:
                run["api"].summary.update(keys)


class SweepReport(Callback):
    """Hydra callback: when a multirun ends, write the compare report into its sweep directory."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        try:
            runs = load_local([sweep])
            if runs:
                print(report(runs, sweep), end="")
                print(f"ringexp: compare report in {sweep}/compare.md")
        except Exception as e:  # the runs' own records are complete; a report that fails must not hide them
            print_warning(f"no compare report for {sweep} ({type(e).__name__}: {e})")


EPILOG = ("Seed groups judge each group against the baseline's on final macro-AUROC (and best AUROC, final and "
          "best F1): equivalent (the 90% interval of the difference within +-margin: two one-sided tests), worse or "
          "better (the 95% interval below or above 0), not equivalent (a difference as large as the margin), or "
          "inconclusive (with the seeds that would decide it); paired over shared seeds, else a bootstrap over the "
          "validation set, which is one seed's indication, never a decision. 'to T s': training seconds to the first "
          "evaluation at macro-AUROC T (eval.targets), 'to T x' the baseline's over it where every seed reached T "
          "(else 'k/n reached'). docs/sweeps.md")


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors (an unknown flag, a flag without its value) as ringexp's one line, exit 2."""

    def error(self, message):
        print_error(f"{message} (python -m ringexp.compare --help)")
        sys.exit(2)


def parser() -> Parser:
    """The command's flags."""
    ap = Parser(prog="python -m ringexp.compare", description=__doc__.split("\n\n")[0], epilog=EPILOG)
    ap.add_argument("paths", nargs="*", help="sweep or run directories")
    ap.add_argument("--baseline", help="the row whose label contains this text is the speed-up baseline")
    ap.add_argument("--out", help="where to write compare.md/.csv and the plots (default: the single PATH)")
    ap.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read runs from the W&B API instead")
    ap.add_argument("--group", help="with --wandb: the sweep's W&B group")
    ap.add_argument("--cluster", action="append", default=[], metavar="PATH",
                    help="a cluster file (the planner's calibrate writes one) besides conf/cluster/: runs on it get "
                    "predictions")
    ap.add_argument("--groups", action="store_const", const=True, help="seed groups (runs differing only in "
                    "seed=: one row each, with time to target and the quality verdict) even where every group has "
                    "one seed; without it they are shown where a group has several")
    ap.add_argument("--quality-budget", type=float, default=quality.MARGIN, metavar="MARGIN",
                    help=f"the equivalence margin of the quality verdicts in macro-AUROC: {quality.MARGIN}")
    ap.add_argument("--f1-budget", type=float, default=quality.F1_MARGIN, metavar="MARGIN",
                    help=f"and in macro-F1 (its seeds spread about twice as far): {quality.F1_MARGIN}")
    ap.add_argument("--family", type=int, metavar="N", help="the configurations a choice among these verdicts "
                    "may take (each test at 5%% / N, so that the chance of choosing a harmful one stays at 5%%; "
                    "plan predict reads them again at its own): default, the seed groups beside the baseline's")
    ap.add_argument("--fastest", metavar="CHOICE", help="print only the value of choice CHOICE (e.g. parallel) of "
                    "the seed group with the highest mean throughput; nothing else is printed or written")
    return ap


def loaded(args) -> list:
    """The runs the flags name, once the flags are checked (ValueError: what is wrong with them)."""
    for flag, margin in (("--quality-budget", args.quality_budget), ("--f1-budget", args.f1_budget)):
        if bad := quality.margin_error(margin):
            raise ValueError(f"{flag} {margin}: {bad}")
    if args.family is not None and args.family < 1:
        raise ValueError(f"--family {args.family}: must be 1 or more (the configurations a choice may take)")
    if args.fastest is not None and (args.groups or not args.fastest):
        raise ValueError("--fastest CHOICE names a choice such as parallel, and prints its value alone "
                         "(without --groups)")
    if args.wandb and not args.group:
        raise ValueError("--wandb needs --group NAME (the sweep's group)")
    if not args.wandb and not args.paths:
        raise ValueError("give one or more sweep or run directories (or --wandb ENTITY/PROJECT --group NAME)")
    runs = load_wandb(args.wandb, args.group) if args.wandb else load_local(args.paths)
    if not runs:
        raise ValueError(f"no runs (summary.json) under {' '.join(args.paths) or args.group}")
    return runs


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        runs = loaded(args)
        if args.fastest is not None:
            print(seeds.fastest(runs, args.fastest))
            return 0
    except (ValueError, FileNotFoundError) as e:
        print_error(str(e))
        return 2
    out = Path(args.out) if args.out else (Path(args.paths[0]) if len(args.paths) == 1 else None)
    try:
        shown, judged = reported(runs, out, args.baseline, args.groups, args.cluster, args.quality_budget,
                                 args.f1_budget, args.family)
    except ValueError as e:  # a --cluster file that cannot be read, a --baseline no run matches: nothing written
        print_error(str(e))
        return 2
    except OSError as e:  # --out a file, a directory not ours to write, a symlink where a file goes: one line
        print_error(f"{printable_path(e.filename or out)}: cannot write the report there ({e.strerror or e}); give "
                    "--out DIR")
        return 2
    print(shown, end="")
    if out is not None:
        print(f"ringexp: wrote {', '.join(OUTPUTS + (GROUP_OUTPUTS if judged else ()))} in {out}")
    return 0

