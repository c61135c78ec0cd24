"""The files of a run directory, written and read in one place.

    summary.json     the run's outcome: the full summary, or {"status": "failed", "error": ...}
    metrics.jsonl    one JSON row per logged step (ringexp.sinks.JsonlSink appends them)
    checkpoints/     tensors written durably (fsync) and read with torch.load(weights_only=True)
    val_scores.pt    the validation labels and the final and best evaluation's probabilities (write_scores)
    bench.json       ringexp.bench's rows (read back by ringexp.plan accuracy and scripts/gpu_check.py)
    trace_rank<r>.json  a profiler trace (profile.enabled=true)

`read_rows` is the one reader of metrics.jsonl (compare, resume and tests use it): a line cut short by a killed
run is dropped, never fatal. Every file ringexp reads back (records, checkpoints' meta, YAML, CSV) goes through
`read_bytes`: a regular file of bounded size, never a FIFO (which would wait forever for a writer), a device or,
inside a run directory, a symlink (which could lead anywhere).

Every file ringexp writes goes through `write_file` (whole files: a temporary file of a fresh name in the same
directory, then renamed over the name, so that a reader sees the old file or the new one, and a symlink planted at
the name or at a fixed temporary name is replaced, never followed), `open_append` (files that grow: metrics.jsonl,
logs; opened without following a symlink) or `make_dir` (a directory ringexp writes into: created, or found as a
real directory, never a symlink). The directory named by the user (hydra.run.dir, out=) may itself be a link the
user made; what ringexp creates inside it is never followed. A path ringexp builds below it from records (a tune's
trials) is checked whole with `inside`: every link on the way followed, it must still lie inside.
"""

import contextlib
import errno
import fcntl
import io
import json
import os
import stat
import tempfile
from pathlib import Path

import torch
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ringexp.errors import ConfigError, RunDirTaken, one_line

METRICS, SUMMARY, BENCH, SCORES = "metrics.jsonl", "summary.json", "bench.json", "val_scores.pt"
SMALL = 16 << 20  # the most a JSON or YAML file ringexp reads may hold (summaries, meta.json, configs: kilobytes)
ROWS = 2 << 30  # the most a metrics.jsonl may hold (a row is under 1 KB: millions of logged steps)
TRACE = 1 << 30  # the most a profiler trace may hold (a few steps: megabytes; with every CUDA kernel, hundreds)


def open_regular(path, follow: bool = False):
    """A regular file opened for reading in binary; OSError naming the file for anything else: a FIFO, a socket
    or a device (opened without blocking, so a FIFO with no writer cannot hang the reader), or a symlink unless
    `follow` (a file the user named may be one; a run directory's own are never)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise OSError(errno.ELOOP, "a symbolic link, which ringexp does not follow here", str(path)) from None
        raise
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return f


def read_bytes(path, limit: int = SMALL, follow: bool = False) -> bytes:
    """A regular file's bytes (`open_regular`), at most `limit` of them (OSError for a larger file)."""
    with open_regular(path, follow) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"more than the {limit} bytes a file here may hold", str(path))
    return data


def parse_json(data):
    """json.loads with nesting too deep for Python (RecursionError) as the ValueError of any other bad JSON."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def read_json(path, limit: int = SMALL):
    """A JSON file (read_bytes' checks); OSError or ValueError saying what is wrong."""
    return parse_json(read_bytes(path, limit))


def read_jsonl(path, limit: int = ROWS) -> list:
    """[(line number, value)] of a file of one JSON value per line (metrics.jsonl, a tune's trials.jsonl); the
    value is None for a line that is not JSON (the last one, cut short by a kill; callers say what others are).
    OSError or ValueError (naming the file and line) when it cannot be ringexp's record: not a regular file, not
    UTF-8, a value nested too deeply. (ringexp writes ASCII: a byte that is not UTF-8 was never written by it.)"""
    out = []
    for lineno, line in enumerate(read_bytes(path, limit).splitlines(), start=1):
        try:
            out.append((lineno, json.loads(line.decode("utf-8"))))
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not UTF-8 (byte {e.start}); it is no record ringexp wrote") from None
        except RecursionError:
            raise ValueError(f"{path}:{lineno}: JSON nested too deeply") from None
        except ValueError:
            out.append((lineno, None))
    return out


def read_rows(run_dir) -> list:
    """metrics.jsonl as a list of rows ([] when there is none yet); a line cut short by a kill is dropped
    (read_jsonl's errors otherwise)."""
    path = Path(run_dir) / METRICS
    if not os.path.lexists(path):
        return []
    return [row for _, row in read_jsonl(path) if isinstance(row, dict) and type(row.get("step")) is int]


def append_line(path, value) -> None:
    """One JSON value as a line appended to `path` (open_append) and flushed to disk: a kill loses no line before it."""
    with open_append(path) as f:
        f.write(json.dumps(value) + "\n")
        f.flush()
        os.fsync(f.fileno())


def rewind(run_dir, source, step: int) -> list:
    """metrics.jsonl of `run_dir` made the rows of `source` (the run a checkpoint came from, often the same) up to
    `step`, rewritten atomically; a resumed run then appends without duplicate steps. Returns those rows."""
    rows = [r for r in read_rows(source) if r["step"] <= step]
    write_file(Path(run_dir) / METRICS, "".join(json.dumps(r) + "\n" for r in rows), durable=True)
    return rows


def read_summary(run_dir):
    """summary.json as parsed (any JSON value: callers check its shape); OSError or ValueError."""
    return read_json(Path(run_dir) / SUMMARY)


def run_rate(summary) -> tuple:
    """(samples/s, step seconds) standing for a completed run: its logged intervals' medians (the steady step),
    or, for a run that averages models every few steps (summary `synchronizations`), its whole run (samples over
    training seconds): a model average lands in one logged interval of several, in none when the period is
    longer, so the median leaves it out (local SGD at period 16 on the slow-link story: 1,400 samples/s by the
    median, about 500 over the run). None for what the summary does not hold."""
    rate, step = (summary.get("throughput") or {}), summary.get("step_time_s")
    step = step.get("median") if isinstance(step, dict) else step
    whole, batch = rate.get("whole_run"), summary.get("global_batch_size")
    if summary.get("synchronizations") and whole and batch:
        return whole, batch / whole
    return rate.get("median"), step


def write_summary(run_dir, summary: dict) -> None:
    """summary.json, replaced atomically (write_json)."""
    write_json(Path(run_dir) / SUMMARY, summary)


def write_json(path, value) -> None:
    """A JSON file, replaced atomically (write_file)."""
    write_file(path, json.dumps(value, indent=2) + "\n")


def write_file(path, data, durable: bool = False) -> None:
    """`data` (str or bytes) as the file `path`, replaced atomically: written to a temporary file of a fresh name
    beside it (O_EXCL: never an existing file or a symlink planted there), then renamed over `path`, which replaces
    a symlink at `path` instead of writing through it. `durable`: flushed to disk before the rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:64]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def open_append(path, buffering: int = -1):
    """A text file opened for appending (created if missing) without following a symlink: OSError naming it for a
    symlink, a FIFO or anything else that is not a regular file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, which ringexp does not write through", str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", buffering=buffering)


def make_dir(path) -> Path:
    """`path` as a directory ringexp writes into: created (with its parents), or found as a real directory; OSError
    naming it when it is a symlink or another kind of file (writing into it could land anywhere)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise OSError(errno.ENOTDIR, "a symbolic link or not a directory, which ringexp does not write into",
                      str(path))
    return path


def inside(root, path) -> Path:
    """`path` with every symbolic link on the way followed, where that lies inside directory `root` (resolved too:
    the directory a user names may be a link); OSError naming `path` otherwise. A link at any name on the way, not
    only the last, would lead a read, a write or a removal anywhere."""
    top = Path(root).resolve()
    try:
        real = Path(path).resolve()
    except RuntimeError:  # (a loop of links)
        raise OSError(errno.ELOOP, "a loop of symbolic links", str(path)) from None
    if not real.is_relative_to(top):
        raise OSError(errno.EXDEV, f"a symbolic link on the way leads outside {top} (to {real})", str(path))
    return real


def read_bench(path):
    """A bench.json of ringexp.bench, as parsed (any JSON value: callers check its rows, as ringexp.plan's
    bench_rows does); OSError or ValueError. `path` is the file, which may be a symlink: users name these."""
    return parse_json(read_bytes(path, SMALL, follow=True))


def read_trace(path):
    """A profiler trace (Chrome trace JSON: {"traceEvents": [...], ...}), as parsed; OSError or ValueError."""
    return read_json(path, TRACE)


def mark_failed(run_dir, error: str, status: str = "failed") -> None:
    """A summary.json that says the run failed (or was `interrupted`) and why; metrics.jsonl, checkpoints and logs
    stay as they are. A completed run's summary is never replaced: a failed or interrupted resumption of it leaves
    it as it was (its failure is in the one line printed, the exit code and the workers' logs)."""
    try:
        if read_summary(run_dir).get("status") == "completed":
            return
    except (OSError, ValueError, AttributeError):  # none yet, or unreadable
        pass
    with contextlib.suppress(OSError):  # a full disk: the one line printed says it all, and nothing is lost
        write_summary(run_dir, {"status": status, "error": error})


def cannot_write(path):
    """The OSError that stops 64 KiB from being written into directory `path`, or None."""
    try:
        with tempfile.TemporaryFile(dir=path) as f:
            f.write(b"\0" * 65536)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return e
    return None


def disk_full(path) -> bool:
    """True when the file system holding `path` cannot take 64 KiB more: the cause to name when a job failed with
    an error that hides it (an empty error file, a JSON file cut short)."""
    e = cannot_write(path)
    return e is not None and e.errno in (errno.ENOSPC, errno.EDQUOT)


def save_tensors(path: Path, obj) -> None:
    """torch.save into a new file (never an existing one or a symlink: O_EXCL), flushed to disk before returning (a
    checkpoint is complete only when its meta.json is)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as f:
        try:
            torch.save(obj, f)
            f.flush()
        except RuntimeError:
            # torch's zip writer reports a write that failed (a full disk) as a position mismatch ("unexpected
            # pos"); one more byte asks the file system itself, whose error says what to do.
            f.write(b"\0")
            f.flush()
            raise
        os.fsync(f.fileno())


def write_scores(run_dir, scores: dict) -> None:
    """val_scores.pt: the validation labels and the probabilities of the final and the best evaluation (what the
    quality tests on the validation set need), replaced whole so that a reader never sees half of it."""
    buf = io.BytesIO()
    torch.save(scores, buf)
    write_file(Path(run_dir, SCORES), buf.getvalue(), durable=True)


def read_scores(run_dir):
    """val_scores.pt as written (tensors and plain values only, read like every record: a regular file of bounded
    size), or None where the run kept none."""
    path = Path(run_dir, SCORES)
    if not os.path.lexists(path):
        return None
    return torch.load(io.BytesIO(read_bytes(path, SMALL)), map_location="cpu", weights_only=True)


def load_tensors(path: Path):
    """Tensors and plain values only: a checkpoint from someone else cannot run code on load."""
    return torch.load(path, map_location="cpu", weights_only=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_held = {}  # run directories this process holds: {resolved path: the open lock file}


LOCK = ".ringexp.lock"


@contextlib.contextmanager
def run_lock(run_dir, what: str = "run", key: str = "hydra.run.dir"):
    """Hold `run_dir` for this run: a second run started into it at the same time gets RunDirTaken. A POSIX record
    lock (lockf) on a file in the directory: the kernel releases it when the process ends, however it ends, and,
    unlike flock, a forked child (a worker) never holds it, so it cannot outlive the launcher that took it.
    Re-entrant within one process (closing a second descriptor of the file would drop a POSIX lock). The file
    names its holder only once the run is accepted (`claim`): a refused command changes nothing on disk."""
    here = Path(run_dir).resolve()
    if here in _held:
        yield
        return
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    try:
        f = open_lock(Path(run_dir) / LOCK)
    except OSError as e:  # a symlink planted there, or a FIFO: not this run's lock
        raise RunDirTaken(f"{key}={run_dir}: its lock file {LOCK} cannot be taken ({e.strerror}); remove it (what "
                          f"it points to is left as it is), or pick another {key}") from None
    try:
        if not locked(f):
            raise RunDirTaken(f"{key}={run_dir}: another {what} is writing there now (pid {holder_pid(f)}); wait "
                              f"for it, or pick another {key}")
        _held[here] = f
        try:
            yield
        finally:
            del _held[here]
    finally:
        f.close()  # (releases the lock)


def open_lock(path):
    """The lock file at `path`, opened for reading and appending without following a symlink (created if missing)."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "a+")


def locked(f) -> bool:
    """Take the lock on open lock file `f` without waiting: False where a live process holds it."""
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise
        return False


def holder_pid(f) -> str:
    f.seek(0)
    return f.read(32).strip() or "?"


def holder(run_dir):
    """The pid (as text, '?' when it has not said) of the live process holding `run_dir`'s lock, or None where none
    does (no lock file, or nobody holds it). Looks without taking the lock for long: a run starting meanwhile
    finds it free a moment later."""
    path = Path(run_dir) / LOCK
    if not os.path.isfile(path) or os.path.islink(path):
        return None
    with open_lock(path) as f:
        if locked(f):
            return None  # (closing the file releases it at once)
        return holder_pid(f)


def claim(run_dir) -> None:
    """The lock file of `run_dir` (held by this process: run_lock) names this process, for a run refused meanwhile."""
    f = _held.get(Path(run_dir).resolve())
    if f is not None:
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()


def load_yaml(schema, path, limit: int = SMALL, follow: bool = False, over=None):
    """A YAML file (a run's config.yaml, a conf/cluster/ file) as the checked dataclass `schema`, merged over `over`
    (a config of that schema; default: the schema's defaults), read as every file (read_bytes: regular, at most
    `limit` bytes; `follow`: the user named it, so it may be a symlink). Anything wrong with it is a ConfigError
    naming it (cannot be read, yaml_text's, a wrong key or type, a value out of range)."""
    try:
        data = read_bytes(path, limit, follow)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    text = yaml_text(path, data)
    try:
        node = OmegaConf.create(text)
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema) if over is None else over, node))
    except (yaml.YAMLError, OmegaConfBaseException, ConfigError) as e:
        raise ConfigError(f"{path}: {one_line(str(e))}") from None


def yaml_text(path, data: bytes, mapping: bool = True) -> str:
    """A YAML file's bytes as text that is safe to build (check_yaml_events); ConfigError naming the file: not
    UTF-8, not YAML (where), an alias, nested too deeply, not a mapping (when `mapping`)."""
    try:
        text = data.decode("utf-8")
        check_yaml_events(text, mapping)
        return text
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{path}: not valid YAML: {e.problem or e.context}{where}") from None
    except (yaml.YAMLError, ConfigError) as e:
        raise ConfigError(f"{path}: {one_line(str(e))}") from None


YAML_DEPTH = 32  # ringexp's YAML files nest 3 levels; PyYAML's parser slows down quadratically with nesting
# ringexp reads YAML as PyYAML and OmegaConf do, by YAML 1.1's rules, where a plain `no`, `yes`, `on` or `off` is a
# boolean and `010` the octal 8; by YAML 1.2's (most other tools', and perhaps the writer's) they are the text 'no'
# and the number 10. Such a value is refused unquoted, so that a file means one thing whoever reads it.
YAML_11 = yaml.resolver.Resolver()  # PyYAML's own YAML 1.1 rules for a plain scalar's type


def check_yaml_events(text: str, mapping: bool = True) -> None:
    """ConfigError unless `text` is one YAML document (a mapping, when `mapping`), nested at most YAML_DEPTH deep,
    without aliases (an alias repeats a whole subtree: a few lines of them nest into billions of nodes once
    built), and without a plain value YAML 1.1 and 1.2 read differently (yaml_11_only). Read as a stream of parser
    events, stopped at the first problem: nothing is built."""
    depth, i = 0, -1
    for i, event in enumerate(yaml.parse(text, Loader=yaml.SafeLoader)):
        if isinstance(event, yaml.AliasEvent):
            raise ConfigError("a YAML alias (*name): ringexp's files have none; write the values out")
        if isinstance(event, yaml.ScalarEvent) and event.style is None and event.tag is None and \
                (why := yaml_11_only(event.value)):
            raise ConfigError(f"line {event.start_mark.line + 1}: {why}")
        if mapping and i == 2 and not isinstance(event, yaml.MappingStartEvent):  # (after stream, document start)
            raise ConfigError("not a YAML mapping of keys to values")
        depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
        if depth > YAML_DEPTH:
            raise ConfigError(f"nested more than {YAML_DEPTH} deep, which no config is")
    if mapping and i < 2:  # an empty file would silently stand for the defaults
        raise ConfigError("not a YAML mapping of keys to values")


def yaml_11_only(value: str) -> str:
    """Why plain (unquoted) `value` means one thing to YAML 1.1 and another to YAML 1.2, or ''."""
    kind = YAML_11.resolve(yaml.ScalarNode, value, (True, False)).rpartition(":")[2]
    if kind == "bool" and value.lower() not in ("true", "false"):
        return (f"{value} unquoted is a boolean to YAML 1.1, as ringexp reads it, but the text '{value}' to YAML 1.2; "
                f"write true or false, or quote it ('{value}')")
    if kind == "int" and value.lstrip("+-")[:1] == "0" and value.lstrip("+-")[1:2].isdigit():
        octal, decimal = int(value.replace("_", ""), 8), int(value)
        return (f"{value} unquoted is the octal {octal} to YAML 1.1, as ringexp reads it, but {decimal} to YAML 1.2; "
                f"write {octal} or {decimal}, or quote it ('{value}')")
    return ""
