"""The cost model's rules that were chosen on the published cases, each with the alternatives it was chosen among
(docs/plan.md, "Rules chosen on the cases"). An alternative is a change to a case's cluster, so that `plan
accuracy` can predict every case under every combination and choose the rules again without the study it scores
(heldout.py). The first alternative of each rule is the model's own: what `predict` uses."""

import dataclasses
import itertools

from ringexp.cluster.schema import CODEC_PASSES
from ringexp.config import NCCL_MAX


def same(cl):
    return cl


def no_bucket_cost(cl):
    return dataclasses.replace(cl, bucket_s=0.0)


def ring_only(cl):
    """NCCL's all-reduce as the ring with the Simple protocol alone (a run's NCCL_ALGO / NCCL_PROTO still win)."""
    return dataclasses.replace(cl, nccl_algo=cl.nccl_algo or "ring", nccl_proto=cl.nccl_proto or "simple")


def line_rate(cl):
    """Every level but a socket one (the socket rule's) at its line rate: the transports' shares left out."""
    full = {level: dataclasses.replace(getattr(cl, level), efficiency=1.0) for level in ("intra", "inter")
            if getattr(cl, level).transport != "socket"}
    return dataclasses.replace(cl, **full)


def socket_share(cl):
    """A socket level at a fixed half of line rate, the model's rule before its streams (NCCL over TCP at 25 and
    100 Gbit/s: nccl-tests#83, nccl#450)."""
    fixed = {level: dataclasses.replace(getattr(cl, level), efficiency=0.5) for level in ("intra", "inter")
             if getattr(cl, level).transport == "socket" and getattr(cl, level).efficiency is None}
    return dataclasses.replace(cl, **fixed)


def streams_only(cl):
    """A socket level's bandwidth from its streams alone, as many CPU threads as it needs (the rule before)."""
    free = {level: dataclasses.replace(getattr(cl, level), socket_threads=NCCL_MAX["NCCL_MAX_NCHANNELS"] *
                                       NCCL_MAX["sockets"]) for level in ("intra", "inter")
            if getattr(cl, level).transport == "socket"}
    return dataclasses.replace(cl, **free)


def no_topology(cl):
    """Every level at its transport's one share, whatever topology it states (the model's rule before topologies)."""
    return dataclasses.replace(cl, **{level: dataclasses.replace(getattr(cl, level), topology="")
                                      for level in ("intra", "inter")})


def free_codec(cl):
    """A codec a GPU cluster's file does not measure at no cost (the model's rule before the generations' costs)."""
    zero = dict.fromkeys(CODEC_PASSES, 0.0)
    return dataclasses.replace(cl, encode_s_per_byte=zero | cl.encode_s_per_byte,
                               decode_s_per_byte=zero | cl.decode_s_per_byte)


def not_slowed(cl):
    return dataclasses.replace(cl, overlap_slowdown=0.0)


# rule: {alternative: change}; the model's own first
RULES = {
    "per-bucket cost": {"on the training thread": same, "none": no_bucket_cost},
    "NCCL's all-reduce": {"NCCL's choice": same, "ring, Simple": ring_only},
    "bandwidth": {"each transport's share": same, "line rate (but sockets)": line_rate},
    "socket bandwidth": {"streams and threads": same, "streams x ceiling": streams_only,
                         "half of line rate": socket_share},
    "links by topology": {"the topology's share": same, "one share per transport": no_topology},
    "GPU codec": {"the generation's cost": same, "free": free_codec},
    "compute beside communication": {"slowed": same, "not slowed": not_slowed},
}


def combinations() -> list:
    """Every combination of the rules' alternatives, [{rule: alternative}], the model's own first."""
    return [dict(zip(RULES, names, strict=True)) for names in itertools.product(*RULES.values())]


def change(combination: dict):
    """The change of a cluster a combination makes: each rule's alternative in turn."""
    changes = [RULES[rule][name] for rule, name in combination.items()]

    def changed(cl):
        for one in changes:
            cl = one(cl)
        return cl

    return changed


def differs(combination: dict) -> str:
    """The rules a combination chooses otherwise than the model, 'rule: alternative; ...', or '' (the model's)."""
    own = combinations()[0]
    return "; ".join(f"{rule}: {name}" for rule, name in combination.items() if name != own[rule])
