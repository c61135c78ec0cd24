"""`python -m ringexp.plan calibrate|predict|accuracy [KEY=VALUE ...]`: what each strategy and compressor will cost
on a cluster before you rent it. The cluster is a few constants (conf/cluster/, ringexp.cluster.costmodel); every number
the planner predicts comes from the code that runs: each strategy's `step_cost` and `traffic` (ringexp.parallel),
each compressor's and collective's `seconds` (ringexp.compress, ringexp.comm).

calibrate  (calibrate.py) On the ranks it runs on (`nprocs` local workers, or every rank of a torchrun or Slurm
           job): each level's message times fitted to alpha + n beta, the cost per byte of an add and of every
           codec, and how much slower a rank computes in training than alone. Writes a conf/cluster/ file
           (clusters.py), or out=PATH.
predict    (predict.py) For cluster=NAME (or a YAML path) and a training config (model=, data.*, accumulation=,
           ... as for ringexp.train): one row per conf/parallel preset (+parallel=P for one), with the predicted
           communication, exposed communication, step time, samples/s, speed-up over ddp and bytes each rank
           sends per step; the recommended command line; a plot of step time against inter-node bandwidth. Into
           out= (default outputs/plan/<cluster>/<model>/): plan.md, plan.json, plan.png.
accuracy   (accuracy.py) bench=[bench.json,...] of ringexp.bench run on the cluster: every row's median against
           the model (accuracy.md, .json and .png into out= when given).

The command line (cli.py) is Hydra's, as ringexp.train's: the planner's keys (PlanConfig) and its `cluster` group
composed with the training config as one (conf/plan.yaml); every other KEY=VALUE is a training override; --help
lists the groups.
"""
