"""What a cluster is and what a configuration's communication costs on it, for everything that predicts (the
planner, compare's predicted columns, the tune) and for every collective, compressor and strategy that answers for
its own cost.

    schema      ClusterConfig, LinkConfig: a cluster file's shape, links, transports and constants
    costmodel   the alpha-beta pieces: a hop, a ring, an all-gather, overlap with backward, a step
    nccl        NCCL's own choice of algorithm and protocol (its tuner's model), for collectives NCCL runs
    files       the cluster files: names, one reader, the file a job ran on (matching), calibrate's writer
"""
