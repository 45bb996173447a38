"""Problems of a configuration, collected rather than raised one at a time.

    problems = Problems()
    problems.positive_int("max_steps", -1, "give the global step to stop at.")
    problems.add_error("bn_mode", ValueError("bn_mode 'snyc' is not a mode. Fix: 'sync'"))
    problems.raise_all()
    # ConfigError: 2 problems in the training configuration (max_steps, bn_mode; ...):
    #   - max_steps: must be an int >= 1, got -1. Fix: give the global step to stop at.
    #   - bn_mode: bn_mode 'snyc' is not a mode. Fix: 'sync'

The build and validate_config use one collector and the same checks: the build
raises what it collected (one problem as the check raised it, so its type is kept;
several as one ConfigError), validate_config reports every problem at once.
"""

import dataclasses
import numbers
from typing import Optional

__all__ = ["ConfigError", "ConfigProblem", "Problems"]


@dataclasses.dataclass(frozen=True)
class ConfigProblem:
    """One bad option: which one, what is wrong, and how to fix it."""

    option: str
    problem: str
    fix: str
    # The exception a check raised, when the problem came from one (kept for its type).
    error: Optional[BaseException] = dataclasses.field(default=None, compare=False,
                                                       repr=False)

    def __str__(self):
        # A problem reported by an option's own check already names the fix.
        return f"{self.option}: {self.problem}" + (f" Fix: {self.fix}" if self.fix else "")


class ConfigError(ValueError):
    """Every problem of a configuration, in one error.

    Attributes:
      problems: the ConfigProblems, in the order the options were checked.
    """

    def __init__(self, problems):
        self.problems = list(problems)
        count = len(self.problems)
        if count == 1:  # the first line is the problem itself
            super().__init__(f"{self.problems[0]} (nothing was built or run)")
            return
        options = ", ".join(dict.fromkeys(p.option for p in self.problems))
        lines = [f"{count} problems in the training configuration ({options}; nothing "
                 "was built or run):"]
        lines += [f"  - {problem}" for problem in self.problems]
        super().__init__("\n".join(lines))


def is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class Problems:
    """Collects ConfigProblems; each check method adds zero or more."""

    def __init__(self):
        self.problems = []

    def __bool__(self):
        return bool(self.problems)

    def add(self, option, problem, fix):
        self.problems.append(ConfigProblem(option, problem, fix))

    def add_error(self, option, error):
        """A check's ValueError or TypeError: its text up to 'Fix: ', and the fix."""
        problem, _, fix = str(error).partition(" Fix: ")
        self.problems.append(ConfigProblem(option, problem, fix, error))

    def attempt(self, option, check, *args):
        """check(*args), its ValueError or TypeError added as `option`'s problem; the
        check's result, or None when it refused."""
        try:
            return check(*args)
        except (ValueError, TypeError) as error:
            self.add_error(option, error)
            return None

    def positive_int(self, option, value, fix, allow_none=True, minimum=1):
        if value is None:
            if not allow_none:
                self.add(option, "is required.", fix)
            return False
        if not is_int(value) or value < minimum:
            self.add(option, f"must be an int >= {minimum}, got {value!r}.", fix)
            return False
        return True

    def raise_all(self):
        """Raises what was collected: one problem as its check raised it, several (or one
        with no exception behind it) as one ConfigError; nothing when there is none."""
        if len(self.problems) == 1 and self.problems[0].error is not None:
            raise self.problems[0].error
        if self.problems:
            raise ConfigError(self.problems)
