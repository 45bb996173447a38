"""Options declared once: name, default, check, one-line doc. The rest derives from it.

    STEP_OPTIONS = OptionTable("build_train_graph", [
        Option("bn_mode", "first_tower", resolve_bn_mode, "how batch norm treats the towers"),
        Option("accumulation_steps", 1, check_accumulation_steps, "micro-batches per step"),
    ])
    STEP_OPTIONS.with_defaults({"bn_mode": "sync"})
    # {'bn_mode': 'sync', 'accumulation_steps': 1}
    STEP_OPTIONS.with_defaults({"bn_mod": "sync"})
    # TypeError: build_train_graph() got an unexpected keyword argument 'bn_mod'. Fix: bn_mode

Adding an option is one line in its table (plus its use): the functions that
take the options by keyword check them against the table, validate_config
runs the same checks, and the tests hold the public signatures and
docs/api.md's option table to it (tests/step/test_declared_options.py), in
the way tf_cnn_benchmarks declares each parameter once.
"""

import dataclasses
import difflib
from typing import Any, Callable, Mapping, Optional

__all__ = ["Option", "OptionTable", "REQUIRED"]


class _Required:
    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()  # the default of an option that has none (train_dir)


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: its name, default, check and one-line doc.

    `check(value)` returns the resolved value (an object for a shorthand) or
    raises ValueError / TypeError whose text names the option and, after
    'Fix: ', the fix; None when the option is checked together with others.
    """

    name: str
    default: Any
    check: Optional[Callable[[Any], Any]]
    doc: str


class OptionTable:
    """The options one function takes by keyword, in its signature's order."""

    def __init__(self, owner, options):
        self.owner = owner
        self.options = tuple(options)
        self._by_name = {option.name: option for option in self.options}

    @property
    def names(self):
        return tuple(self._by_name)

    def __getitem__(self, name) -> Option:
        return self._by_name[name]

    def __contains__(self, name):
        return name in self._by_name

    def without(self, *names, owner=None):
        """The table less `names` (an option another function decides itself)."""
        return OptionTable(owner or self.owner,
                           [o for o in self.options if o.name not in names])

    def checks(self) -> Mapping[str, Callable]:
        """{name: check} of the options checked one by one."""
        return {o.name: o.check for o in self.options if o.check is not None}

    def unknown(self, given):
        """[(unknown name, the closest declared name or None)] of the names in `given`."""
        return [(name, (difflib.get_close_matches(name, self.names, n=1) or [None])[0])
                for name in given if name not in self._by_name]

    def refuse_unknown(self, given):
        """Raises TypeError, as Python does for a keyword, naming the closest option."""
        for name, closest in self.unknown(given):
            hint = f"{closest}" if closest else f"one of {', '.join(self.names)}"
            raise TypeError(f"{self.owner}() got an unexpected keyword argument {name!r}. "
                            f"Fix: {hint}.")

    def pick(self, namespace):
        """{name: value} of the declared options in `namespace` (a function's locals())."""
        return {name: namespace[name] for name in self.names if name in namespace}

    def with_defaults(self, given, required=True):
        """Every option: the given value, else its default (unknown names refused). A
        required option not given is refused, or None with required=False (for a
        check that reports it among other problems)."""
        self.refuse_unknown(given)
        missing = [o.name for o in self.options if o.default is REQUIRED and o.name not in given]
        if missing and required:
            raise TypeError(f"{self.owner}() needs the option {missing[0]!r}.")
        return {o.name: given.get(o.name, None if o.default is REQUIRED else o.default)
                for o in self.options}

    def markdown(self):
        """A Markdown table: option, default, what it is."""
        rows = ["| option | default | what it is |", "| --- | --- | --- |"]
        rows += [f"| `{o.name}` | `{o.default!r}` | {o.doc} |" for o in self.options]
        return "\n".join(rows)
