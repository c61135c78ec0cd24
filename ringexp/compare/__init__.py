"""`python -m ringexp.compare PATH...`: the runs of one or more sweeps as one table and a few plots (the command's
own docstring, in cli, says what it does). The package, by concern:

    load     the runs: local run directories or a W&B group, each summary checked against ringexp.summary
    table    the runs' table: labels, the baseline, the columns, the backend's variables, the predicted columns
    render   compare.md, the terminal table, compare.csv and the plots
    groups   seed groups, their quality verdicts and time to target; groups.csv and quality.json
    members  which runs a seed group holds (the baseline's task and code versions, one per seed), and why the others not
    cells    how a value is written as a table's cell
    cli      the command: its flags, report(), the verdicts into W&B, the sweep's Hydra callback SweepReport

What others use is named here: SweepReport (conf/train.yaml's hydra.callbacks), main (__main__), load_local (the
tune), report, and the names of what the report writes.
"""

from ringexp.compare.cli import GROUP_OUTPUTS, OUTPUTS, SweepReport, main, report
from ringexp.compare.load import YAML_LIMIT, load_local, unflatten
from ringexp.compare.table import calibrations

__all__ = ["GROUP_OUTPUTS", "OUTPUTS", "YAML_LIMIT", "SweepReport", "calibrations", "load_local", "main", "report",
           "unflatten"]
