"""`python -m ringexp.compare PATH...`: the runs of one or more sweeps as one table and a few plots (the command's
own docstring, in cli, says what it does). The package, by concern:

    table    the runs' table: labels, the baseline, the columns, the backend's variables, the predicted columns
    render   compare.md, the terminal table, compare.csv and the plots
    cli      the command: its flags, report(), the verdicts into W&B, the sweep's Hydra callback SweepReport

The runs it reads, their seed groups and verdicts are ringexp.verdicts', below every command (the tune judges
with them too). What others use is named here: SweepReport (conf/train.yaml's hydra.callbacks), main (__main__),
report, calibrations, and the names of what the report writes.
"""

from ringexp.compare.cli import GROUP_OUTPUTS, OUTPUTS, SweepReport, main, report
from ringexp.compare.table import calibrations

__all__ = ["GROUP_OUTPUTS", "OUTPUTS", "SweepReport", "calibrations", "main", "report"]
