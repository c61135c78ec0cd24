"""Error feedback and DGC's momentum correction, for any compressor.

Error feedback (Seide et al. 2014; Karimireddy et al. 2019): compress x = gradient + residual and keep
residual = x - what was sent, so every coordinate is sent eventually; invariant: sent + new residual ==
gradient + old residual. Momentum correction (Lin et al., Deep Gradient Compression, 2018; SGD only):
momentum is applied before compression (u = m u + g; the residual accumulates u), and u is cleared where a
value was sent (momentum factor masking); the optimizer then runs without momentum of its own.

DDP rebuilds its buckets after the first step (in the order gradients became ready), so state kept from step 0
would be added to the wrong parameters: it starts at step 1. Residuals are kept per bucket index."""


def before(flat, state, bucket: int):
    """The tensor to compress: the gradient plus the residual (and through momentum, with correction)."""
    c = state.c
    if c.momentum_correction:
        u = state.velocity.get(bucket)
        u = flat.clone() if u is None else u.mul_(state.momentum).add_(flat)
        state.velocity[bucket] = u
        grad = u
    else:
        grad = flat
    r = state.residual.get(bucket)
    if r is not None:
        return grad + r
    # with error feedback, x must outlive the collective, which overwrites `flat` with the sum
    return grad.clone() if state.ef and grad is flat else grad


def after(x, sent, state, bucket: int) -> None:
    if state.steps.get(bucket, 0) <= 1:  # step 0: the bucket layout may still change
        state.residual.pop(bucket, None)
        state.velocity.pop(bucket, None)
        return
    state.residual[bucket] = x - sent
    if state.c.momentum_correction:
        state.velocity[bucket].masked_fill_(sent != 0, 0.0)


__all__ = ["before", "after"]
