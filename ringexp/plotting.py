"""matplotlib for the figures ringexp writes (compare's, the planner's): files only, no display."""


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported when a figure is drawn (importing it costs about a second,
    and a machine without a display must not pick an interactive backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
