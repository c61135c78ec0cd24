"""Cluster files (conf/cluster/*.yaml): the ones there are, one read and checked, the one a job ran on (matched on
what its summary records: nodes, ranks per node, link; for compare's predicted columns and the tune), one written
from calibrate's measurements."""

import hashlib
import re
import subprocess
from datetime import date
from pathlib import Path

from omegaconf import OmegaConf

from ringexp import records
from ringexp.cluster.schema import SOCKET_BPS_MAX, ClusterConfig, LinkConfig, bytes_per_s
from ringexp.config import CONF_DIR
from ringexp.errors import ConfigError

DIR = Path(CONF_DIR, "cluster")  # the shipped and calibrated cluster files
LIMIT = 1 << 20  # the most a cluster file may hold (they take 2 KB)
NAME_BYTES = 80  # the most of a name that names a file or directory (a file system takes 255 bytes)


def file_name(text: str) -> str:
    """`text` (a cluster's or a link's name) as one plain file or directory name: a slash, a backslash or a control
    character as '_', and a name longer than NAME_BYTES cut, with a hash of the whole so that two long names
    sharing their start stay apart (a cluster file's name of 900 KB is no path any file system takes)."""
    name = re.sub(r"[/\\\x00-\x1f\x7f]", "_", text)
    if name in ("", ".", ".."):
        return "_"
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= NAME_BYTES:
        return name
    return raw[:NAME_BYTES - 9].decode("utf-8", "ignore") + "-" + hashlib.sha256(raw).hexdigest()[:8]


def names() -> list:
    return sorted(p.stem for p in DIR.glob("*.yaml"))


def path_of(name: str) -> Path:
    """The file of a cluster given by name (conf/cluster/NAME.yaml) or by path (NAME.yaml)."""
    return Path(name) if name.endswith((".yaml", ".yml")) else DIR / f"{name}.yaml"


def read(path, over=None, key: str = "cluster"):
    """The checked ClusterConfig of a cluster file (over `over`, a composed cluster config): a regular file of at
    most LIMIT bytes (a FIFO or a device is refused, not waited on), UTF-8 YAML, every number finite and in its
    range; ConfigError naming the file (as `key`=path) otherwise."""
    try:
        return records.load_yaml(ClusterConfig, path, LIMIT, follow=True, over=over)
    except ConfigError as e:
        if not str(e).startswith(f"{path}: cannot read it"):
            raise
        raise ConfigError(f"{key}={e}; give a cluster YAML file") from None


def calibrations(given=()) -> dict:
    """{(nodes, ranks per node, link): ClusterConfig} of the cluster files `given` (ConfigError if one cannot be
    read) and the readable conf/cluster/ files, the given ones first: where jobs may have run (a run records the
    same three in its summary)."""
    out = {}
    for path in [*map(Path, given), *(path_of(n) for n in names())]:
        try:
            cl = read(path)
        except ConfigError:
            if str(path) in map(str, given):
                raise
            continue
        out.setdefault((cl.nodes, cl.ranks_per_node, cl.link), cl)
    return out


def matching(nodes: int, ranks_per_node: int, link: str, known: dict | None = None):
    """The cluster file of a job of this shape and link (`known`: calibrations() already read), or None."""
    return (calibrations() if known is None else known).get((nodes, ranks_per_node, link))


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=CONF_DIR, timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def inter_level(got: dict, line_rate: str | None, note: str, streams: int = 0) -> dict:
    """A level as a file keeps it: at `line_rate` (a tc rate: the measured inter-node level's) with what the
    transport reached of it, when the rate is known and the link ran below it; else as measured. What it reached
    is kept as an efficiency, or, given the TCP `streams` the measurement ran over, as the socket transport's
    per-stream ceiling that gives the measured rate (costmodel.efficiency: 1 / rate = 1 / (streams x ceiling) +
    1 / line rate), so that a run with more streams is predicted faster."""
    line = bytes_per_s(line_rate) if line_rate else None
    level = {"alpha_s": got["alpha_s"], "beta_s_per_byte": got["beta_s_per_byte"], "transport": "measured",
             "source": f"{note}; fit error by size {by_size(got)}"}
    if not line or 1 / line >= got["beta_s_per_byte"]:
        return level
    level |= {"beta_s_per_byte": 1 / line, "source": f"{level['source']}; line rate {line_rate}"}
    ceiling = 1 / (streams * (got["beta_s_per_byte"] - 1 / line)) if streams else 0.0
    if streams and ceiling <= SOCKET_BPS_MAX:  # (beyond: the link ran at its line rate, to within the measurement)
        return level | {"transport": "socket", "streams": streams, "socket_Bps": ceiling,
                        "source": f"{level['source']}, of which {streams} TCP stream(s) reached the measured rate: "
                                  f"{ceiling / 1e9:.3g} GB/s each at most"}
    return level | {"efficiency": (1 / line) / got["beta_s_per_byte"],
                    "source": f"{level['source']}, of which the transport reached the efficiency"}


def with_shares(level: dict, got: dict, messages: dict) -> dict:
    """The level with the share of its line rate an all-to-all and gloo's all-gather reached
    (`all_to_all_efficiency`, `all_gather_efficiency`), where calibrate measured them (got[KIND]: [bytes, seconds]);
    `messages`: {KIND: the messages of that many bytes a node's link carries in turn}. On the local cluster's
    shaped links gloo's all-to-all reached 0.75-0.8 of the rate where a ring reached 0.9, and its all-gather
    between 2 ranks about 0.6 (its send posted first). Kept whatever it is (at most 1): a share kept only where it
    fell 5% short of the ring's came and went with the noise of one calibration to the next."""
    link = LinkConfig(**{k: v for k, v in level.items() if k != "source"})
    for kind, count in messages.items():
        if not got.get(kind) or count < 1:
            continue
        nbytes, took = got[kind]
        share = count * nbytes * link.beta_s_per_byte / max(took - count * link.alpha_s, 1e-12)
        level = level | {f"{kind}_efficiency": min(1.0, share),
                         "source": f"{level['source']}; {kind.replace('_', '-')} of {size(nbytes)} messages "
                                   f"({count} through a node's link) {took * 1e3:.0f} ms: {kind}_efficiency"}
    return level


def from_measurements(m: dict, out: str | None, label: str | None, line_rate: str | None = None,
                      streams: int = 0) -> tuple:
    """(name, YAML text) of a cluster file from calibrate's measurements `m`; `out`: the file's path (its stem
    names the cluster), `label`: the link's name (else the job's, as runs record it); `line_rate`: the inter-node
    link's rate, for its efficiency (else the label's, where the label is a rate); `streams`: the TCP streams the
    inter-node measurement ran over, to keep what the link reached as a socket ceiling (0: as an efficiency)."""
    link = label or m["link"]
    line_rate = line_rate or (link if bytes_per_s(link) else None)
    name = Path(out).stem if out else file_name(f"calibrated_{m['nodes']}x{m['ranks_per_node']}_{link}")
    how = f"measured by python -m ringexp.plan calibrate at commit {commit()} on {date.today()}"
    levels = {}
    for level in ("intra", "inter"):
        got = m.get(level) or m.get("intra") or m.get("inter")
        note = how if level in m else f"not measured (no second {'rank on a node' if level == 'intra' else 'node'}"\
            f"): the other level's values"
        inter = level == "inter" and "inter" in m
        levels[level] = inter_level(got, line_rate if inter else None, note, streams if inter else 0)
        if inter:  # a node's link carries its k ranks' messages to the p - k ranks elsewhere; a ring's p - 1 steps
            k, p = m["ranks_per_node"], m["nodes"] * m["ranks_per_node"]
            levels[level] = with_shares(levels[level], got, {"all_to_all": k * (p - k), "all_gather": p - 1})
    body = {"name": name, "nodes": m["nodes"], "ranks_per_node": m["ranks_per_node"], "link": link,
            "backend": m["backend"], **levels,
            "add_s_per_byte": m["add_s_per_byte"], "encode_s_per_byte": m["encode_s_per_byte"],
            "decode_s_per_byte": m["decode_s_per_byte"], "compute_slowdown": m["compute_slowdown"],
            "jitter_s": m["jitter_s"],
            "cpu_threads": m["cpu_threads"], "call_s": m["call_s"], "bucket_s": m["bucket_s"], "source": how}
    return name, f"# {how}\n" + OmegaConf.to_yaml(OmegaConf.create(body))


def write(m: dict, out: str | None, label: str | None, line_rate: str | None = None, streams: int = 0) -> None:
    """The cluster file of calibrate's measurements, into `out` or conf/cluster/, and what was measured."""
    name, text = from_measurements(m, out, label, line_rate, streams)
    path = Path(out) if out else path_of(name)
    path.parent.mkdir(parents=True, exist_ok=True)  # out='s (the user's) or conf/cluster/
    records.write_file(path, text)  # never through a symlink at its name
    for level in ("intra", "inter"):
        if level in m:
            f = m[level]
            seen = ", ".join(f"{b >> 10} KB {t * 1e3:.2f} ms" for b, t in f["points"])
            print(f"ringexp: {level}: alpha {f['alpha_s'] * 1e6:.1f} us, {8 / f['beta_s_per_byte'] / 1e9:.2f} Gbit/s; "
                  f"measured {seen}; fit error by size {by_size(f)}")
            for kind in ("all_to_all", "all_gather"):
                if f.get(kind):
                    print(f"ringexp: {level}: {kind.replace('_', '-')} of {size(f[kind][0])} messages took "
                          f"{f[kind][1] * 1e3:.1f} ms")
    print(f"ringexp: add {1 / m['add_s_per_byte'] / 1e9:.2f} GB/s, compute slowdown {m['compute_slowdown']:.2f}, "
          f"jitter {m['jitter_s'] * 1e3:.2f} ms, "
          f"per call {m['call_s'] * 1e6:.0f} us, per DDP bucket {m['bucket_s'] * 1e6:.0f} us; "
          f"wrote {path} (use it: python -m ringexp.plan predict cluster={name})")


def by_size(f: dict) -> str:
    """A level's fit error at every measured size: '4 KB +3%, 64 KB -12%, ...'."""
    return ", ".join(f"{size(b)} {e:+.0%}" for (b, _), e in zip(f["points"], f["errors"], strict=True))


def size(b: int) -> str:
    return f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB"
