"""How the study reads a reply's boxed answer, one definition for the TRL reward and the report."""


def last_box(text):
    """The content of the reply's last \\boxed{...} with its braces closed, stripped; None without
    one or when it is empty (an empty box is no answer, as comas's grader reads it)."""
    i = text.rfind("\\boxed{")
    if i < 0:
        return None
    depth, start = 0, i + len("\\boxed{")
    for j, ch in enumerate(text[i + len("\\boxed"):]):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return text[start:i + len("\\boxed") + j].strip() or None
    return None
