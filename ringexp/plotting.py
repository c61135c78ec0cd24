"""matplotlib for the figures ringexp writes (compare's, the planner's): files only, no display."""

import io

from ringexp import records

TITLE = 120  # the most characters of a name (a cluster's, a run's) that a title or a label shows


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported when a figure is drawn (importing it costs about a second,
    and a machine without a display must not pick an interactive backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path, dpi: int = 100) -> None:
    """`fig` as the PNG `path`, written as every file ringexp writes (records.write_file: atomic, never through a
    symlink), and closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    pyplot().close(fig)
    records.write_file(path, buf.getvalue())


def short(text, limit: int = TITLE) -> str:
    """`text` cut to `limit` characters (with an ellipsis) for a title or a label: matplotlib lays out every
    character, and a name of 900 KB took minutes."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"
