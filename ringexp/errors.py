"""What can go wrong that a user caused or must hear about, and the one line that says so.

The bottom layer: every other module may raise these; this module imports nothing of ringexp's.
ConfigError and DataError are the user's to fix (exit code 2); CheckpointError means the newest checkpoint was
not written (the previous one is intact); PEER_LOST are the words of an error that only says a peer went away,
a consequence, never the cause of a failed job.
"""

import sys


class ConfigError(ValueError):
    """A mistake in the user's configuration; the message says what to do."""


class DataError(ConfigError):
    """A problem with the user's data (missing folder, bad CSV, unreadable image); the message names the file."""


class RunDirTaken(ConfigError):
    """The run directory belongs to another run (running now, or finished without resume): nothing may be written
    into it, not even a failed summary."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the previous one is intact."""


class PeerLost(RuntimeError):
    """A rank's collective failed because peers went silent; the message names them. Reported as a failure even
    when the rank's agent is stopping it meanwhile (a rank beside it, which found the same, ended first)."""


# what a worker's error says when the cause is another worker that died, hung or was cut off: gloo's and c10d's
# words (gloo fails the other operations on a pair that timed out with "Application timeout caused pair
# closure", seen in CI on the ranks of a node whose link was cut)
PEER_LOST = ("peer", "connection closed", "connection reset", "broken pipe", "timed out", "timeout caused",
             "socket timeout", "connect timeout", "unreachable", "no route to host")


TIMED_OUT = ("timed out", "timeout caused")  # a wait ran out (gloo's words for the pair it then closed too)


def peer_lost(message: str) -> bool:
    return any(p in message.lower() for p in PEER_LOST)


def timed_out(message: str) -> bool:
    """The error says a wait ran out: the peer hangs or was stopped (one that died resets the connection)."""
    return any(p in message.lower() for p in TIMED_OUT)


def print_error(message: str) -> None:
    """ringexp's one line for a failure: `ringexp: error: <what is wrong and what to do>` on stderr."""
    # one write: the ranks of a torchrun job share one stderr, and a line written in two parts can be split by
    # another rank's
    sys.stderr.write(f"ringexp: error: {message}\n")
    sys.stderr.flush()


def print_warning(message: str) -> None:
    first_line = message.splitlines()[0] if message else message
    print(f"ringexp: warning: {first_line}", file=sys.stderr, flush=True)


def one_line(message: str) -> str:
    """An exception's message in one line: its first line, or for an exception a DataLoader worker re-raised
    (whose message carries the original traceback) the last line, which holds the original error."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if "Original Traceback" in message else lines[0]
