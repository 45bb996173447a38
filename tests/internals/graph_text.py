"""Comparing two graphs built in one process, whose function names count on."""

import re

__all__ = ["canonical_graph_text"]


def canonical_graph_text(graph):
    """The GraphDef as text without the process-wide counters in names: each function
    renamed by the order in which the graph first refers to it, and custom gradients'
    ids renumbered the same way."""
    graph_def = graph.as_graph_def()
    functions = {f.signature.name: f for f in graph_def.library.function}
    pattern = re.compile("|".join(rf"\b{re.escape(name)}(?!\d)"
                                  for name in sorted(functions, key=len, reverse=True)))
    order = {}

    def renamed(text):
        if not functions:
            return text
        for match in pattern.finditer(text):
            order.setdefault(match.group(0), f"function_{len(order)}")
        return pattern.sub(lambda match: order[match.group(0)], text)

    ids = {}

    def renumbered(text):  # tf.custom_gradient's ids count across the process too
        return re.sub(r"CustomGradient-(\d+)",
                      lambda m: f"CustomGradient-{ids.setdefault(m.group(1), len(ids))}", text)

    parts = [len(functions), renumbered(renamed("".join(str(node) for node in graph_def.node)))]
    done = set()
    while len(done) < len(order):  # each function once, in the order first referred to
        for name in [n for n in order if n not in done]:
            done.add(name)
            parts.append(renumbered(renamed(str(functions[name]))))
    return parts
