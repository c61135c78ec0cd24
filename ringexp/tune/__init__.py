"""`python -m ringexp.tune`: seed article 004's tuning loop, automated and checked on quality (docs/tune.md).

    cli        the command line, the checks made before anything is written, the run of the phases
    loop       the phases over one directory: diagnose, predict, try (successive halving), verify, refit
    space      presets x knobs: the candidates, ranked and pruned by the planner
    trials     one training run through the user's launcher, and trials.jsonl
    diagnose   seed article 004's checklist on the baseline's numbers
    refit      the cluster's constants refitted on the trials
    playbook   playbook.md, best.yaml and the plots
"""
