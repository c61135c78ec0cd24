"""What the tests share, imported by name from its module (conftest.py holds only fixtures and hooks):
processes (the real command lines, gloo workers, the warm interpreter's clients), runs (the tiny run, strategies
on real process groups, runs killed and resumed), wandb_log (an offline W&B run's records), zygote (the warm
interpreter itself)."""
