"""DiLoCo (parallel.strategy=diloco; Douillard et al. 2023, arXiv 2311.08105): every rank takes
`parallel.period` inner steps with the configured optimizer (AdamW by default), then the ranks average their
pseudo-gradients (the anchor minus the local weights) and take an outer SGD step with Nesterov momentum
(`parallel.outer_lr`, `parallel.outer_momentum`; the paper's 0.7 and 0.9) on the anchor, which every rank then
continues from. Inner optimizer per node with `parallel.within_node`; fragments synchronised at staggered steps
(Streaming DiLoCo) with `parallel.fragments`. The exchange, the schedule, the state and the cost are local SGD's
(local_sgd.py): with outer_lr=1 and outer_momentum=0 DiLoCo is local SGD.
"""

from ringexp.parallel.local_sgd import LocalSGDStrategy


class DiLoCoStrategy(LocalSGDStrategy):
    def outer_settings(self) -> tuple:
        return self.cfg.parallel.outer_lr, self.cfg.parallel.outer_momentum
