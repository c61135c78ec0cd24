"""Studies of ringexp: analyses that depend on the product and that the product never imports (pyproject.toml's
import-linter contract says so), as torchtitan keeps its experiments/. Each is run from the repository's root:

    python -m studies.tune_replay [SWEEP.json]     the tune's order against random order and Optuna, replayed on a
                                                   recorded exhaustive sweep (docs/results/tune-replay.md)
    python -m studies.tune_story OUT [SWEEP.json]  the tune story's report (scripts/tune_story.sh,
                                                   docs/results/tune-story.md)
"""
