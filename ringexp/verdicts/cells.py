"""How compare writes a value as a cell of a table (whether a value is text that can be written anywhere is
ringexp.summary.is_text)."""

from ringexp.summary import KINDS, is_text


def fmt(key: str, value) -> str:
    """A table's cell: a share as a percentage, a ratio with x, a quality metric to 3 places."""
    if value is None:
        return "-"
    if key in ("comm share", "overlap"):
        return f"{value:.0%}"
    if key == "step error":
        return f"{value:+.0%}"
    if key == "AUROC vs baseline":
        return f"{value:+.3f}"
    if key == "speed-up" or key.endswith(" x"):
        return f"{value:.2f}x"
    if key.endswith("AUROC") or key.endswith("F1"):
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def lr_rule(record) -> str | None:
    """The rule that set a run's learning rate and its factor on optim.lr, e.g. 'sqrt x2', from a summary's lr_rule
    (or a tune trial's, which copies it); None where none is recorded or it is not a rule and a number."""
    r = record.get("lr_rule")
    if not isinstance(r, dict) or not is_text(r.get("rule")) or not KINDS["a number >= 0"](r.get("factor")):
        return None
    return f"{r['rule']} x{r['factor']:.3g}"


def aligned(cells) -> list:
    """Rows of cells as lines of columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(c[j]) for c in cells) for j in range(len(cells[0]))]
    return ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True)))
            for row in cells]


def markdown_table(head: list, cells: list) -> list:
    """Lines of a markdown table of `cells` (rows of text) under `head`."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(c) + " |" for c in cells]
