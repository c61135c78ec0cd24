"""Periodic model averaging with an outer step: local SGD's and DiLoCo's algorithm, for ringexp's strategies
(local_sgd.py, diloco.py) and for a user's own training loop.

    averager = ringexp.Averager(model, period=16, outer_lr=0.7, outer_momentum=0.9, compression="int8")
    for step in range(1, steps + 1):
        loss.backward(); opt.step(); opt.zero_grad()      # each rank alone: no DDP, or DDP under no_sync
        averager.step(step)                               # synchronises when due (every fragment at last_step)

A synchronisation exchanges the pseudo-gradient, the anchor (the weights of the last synchronisation) minus the
local weights, averaged over the group's ranks with `algorithm` (ringexp.comm's) and `compression` (any of the
hook's compressors, with its error feedback: one residual per fragment), then takes an outer SGD step on the
anchor with it and copies the anchor into the model. With outer_lr=1 and no momentum the anchor becomes the ranks'
average, which is local SGD (PyTorch's PeriodicModelAverager, exactly so without compression); DiLoCo's outer
step has its own rate and Nesterov momentum. PyTorch's averagers all-reduce the parameters themselves,
uncompressed, with the builtin all-reduce; the pseudo-gradient is what a compressor with error feedback can
carry.

What avoids the traps users of PyTorch's averagers hit:
- the schedule is a function of the optimizer step the caller passes (and checkpoints), not a counter of its own
  (pytorch#74737: counted per parameter group; #74556: not checkpointed, so warm-up ran again after a resume);
- only parameters that require gradients are averaged and stepped (#74157: frozen parameters averaged too);
  floating-point buffers (batch-norm statistics) are averaged plainly with fragment 0;
- the pseudo-gradient is anchor - local, so that the outer step goes where the local steps went (torchft#233).
Fragments (Streaming DiLoCo) are contiguous parts of the model of about equal size, fragment i synchronised at
local step i * period / fragments of each period, so that the bytes of a period are spread over it.
"""

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ringexp import comm
from ringexp.parallel import hooks


@dataclass
class Fragment:
    """Parameters synchronised together, their anchors (float32: the last synchronisation's weights) and the outer
    optimizer that steps the anchors with the averaged pseudo-gradient."""
    params: list
    anchors: list = field(default_factory=list)
    outer: torch.optim.Optimizer | None = None

    @property
    def layout(self) -> list:
        return [p.numel() for p in self.params]


class Averager:
    def __init__(self, model, period: int, *, warmup_steps: int = 0, fragments: int = 1, outer_lr: float = 1.0,
                 outer_momentum: float = 0.0, algorithm: str = "builtin", compression=None, group=None,
                 last_step: int | None = None, timer=None, **options):
        """`model`: a module (or a DDP wrapper's); `compression`: a name, a dict of CompressionConfig fields or a
        ringexp.compress.State; `options`: the collective's (ringexp.all_reduce's). The first synchronisation is
        `period` steps after `warmup_steps` (before it, the caller keeps the ranks equal, e.g. with DDP);
        `last_step`: the step at which every fragment synchronises (the final model is the ranks' average);
        `timer`: a ringexp.timing.CommTimer that each synchronisation is reported to."""
        if period < 1 or fragments < 1 or outer_lr <= 0 or not 0 <= outer_momentum < 1:
            raise ValueError(f"period={period}, fragments={fragments} (both >= 1), outer_lr={outer_lr} (> 0), "
                             f"outer_momentum={outer_momentum} (in [0, 1))")
        module = getattr(model, "module", model)
        params = [q for q in module.parameters() if q.requires_grad]
        if fragments > len(params):
            raise ValueError(f"fragments={fragments}: the model has {len(params)} trainable tensors")
        self.period, self.warmup_steps, self.last_step, self.timer = period, warmup_steps, last_step, timer
        state = compression if compression is None or hasattr(compression, "state_dict") else \
            hooks.compressor(compression, algorithm)
        self.exchange = hooks.CommState(algorithm, comm.options_for(algorithm, options), state, group)
        self.group, self.world = group, dist.get_world_size(group)
        self.fragments = [Fragment(part) for part in split(params, fragments)]
        for f in self.fragments:
            f.anchors = [q.detach().float().clone() for q in f.params]
            f.outer = torch.optim.SGD(f.anchors, lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)
        self.buffers = [b for b in module.buffers() if b.is_floating_point()]
        self.buffer_anchors = [b.detach().clone() for b in self.buffers]
        self.done, self.syncs = 0, 0  # optimizer steps completed (the schedule's clock), synchronisations

    @property
    def local(self) -> bool:
        """Whether the next step is a local one (the warm-up is over)."""
        return self.done >= self.warmup_steps

    def step(self, step: int) -> None:
        """After optimizer step `step` (1, 2, ...): the fragments due are synchronised."""
        self.done = step
        if step <= self.warmup_steps:
            if step == self.warmup_steps:  # the warm-up's weights, the same on every rank, start the local phase
                self.copy(self.params, self.anchors)
            return
        local, last = step - self.warmup_steps, step == self.last_step
        for i, f in enumerate(self.fragments):
            if last or local % self.period == i * self.period // len(self.fragments):
                self.synchronise(i, f)

    @property
    def params(self) -> list:
        return [q for f in self.fragments for q in f.params] + self.buffers

    @property
    def anchors(self) -> list:
        return [a for f in self.fragments for a in f.anchors] + self.buffer_anchors

    @staticmethod
    def copy(sources: list, targets: list) -> None:
        with torch.no_grad():
            for s, t in zip(sources, targets, strict=True):
                t.copy_(s)

    def synchronise(self, i: int, f: Fragment) -> None:
        """Fragment `i`: the averaged pseudo-gradient, the outer step on the anchors, the anchors copied into the
        model (on the calling thread, which waits for it: exposed communication)."""
        span = self.timer.start() if self.timer is not None else None
        with torch.no_grad():
            flat = torch.cat([(a - q.detach().float()).reshape(-1) for a, q in zip(f.anchors, f.params, strict=True)])
            hooks.reduce_bucket(self.exchange, flat, i, self.group, self.world, f.layout)
            for a, g in zip(f.anchors, flat.split(f.layout), strict=True):
                a.grad = g.view_as(a)
            f.outer.step()
            self.copy(f.anchors, f.params)
            if i == 0 and self.buffers:
                self.average_buffers()
        if span is not None:
            self.timer.end(span, blocking=True)
            self.timer.keep(span)
        self.syncs += 1

    def average_buffers(self) -> None:
        flat = torch.cat([b.reshape(-1).float() for b in self.buffers]) / self.world
        dist.all_reduce(flat, group=self.group)
        self.copy([v.view_as(b) for b, v in zip(self.buffers, flat.split([b.numel() for b in self.buffers]),
                                                strict=True)], self.buffers)
        self.copy(self.buffers, self.buffer_anchors)

    @contextmanager
    def global_model(self):
        """The anchors (the last synchronisation's model, the same on every rank) in the model inside the block;
        the local weights back afterwards. For evaluating, or saving, the model the ranks agree on."""
        held = [q.detach().clone() for q in self.params]
        self.copy(self.anchors, self.params)
        try:
            yield
        finally:
            self.copy(held, self.params)

    def state_dict(self) -> dict:
        """The schedule's clock, the anchors and their outer optimizers, the averaged buffers, the compressor's
        residuals: what a resumed run needs to continue bit for bit (tensors and numbers: weights_only loads)."""
        return {"done": self.done, "syncs": self.syncs, "anchors": [f.anchors for f in self.fragments],
                "outer": [f.outer.state_dict() for f in self.fragments], "buffers": self.buffer_anchors,
                "exchange": self.exchange.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.done, self.syncs = state["done"], state["syncs"]
        saved = [a for anchors in state["anchors"] for a in anchors] + list(state["buffers"])
        self.copy(saved, self.anchors)
        for f, outer in zip(self.fragments, state["outer"], strict=True):
            f.outer.load_state_dict(outer)
        self.exchange.load_state_dict(state["exchange"])


def split(params: list, n: int) -> list:
    """`params` in `n` contiguous parts of about equal numbers of elements, in the model's order (each part at
    least one tensor: n is at most the tensors)."""
    total, parts, part, filled = sum(q.numel() for q in params), [], [], 0
    for k, q in enumerate(params):
        part.append(q)
        filled += q.numel()
        left, wanted = len(params) - k - 1, n - len(parts) - 1  # tensors after this one, parts after this one
        if wanted and (filled >= total * (len(parts) + 1) / n or left == wanted):
            parts.append(part)
            part = []
    return [*parts, part] if part else parts
