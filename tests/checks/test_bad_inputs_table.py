"""Every bad input of tests/checks/bad_inputs.py gets a first line that says what is wrong,
and the ledger, tests/faults_ledger.md, shows exactly what the script prints.

A case whose first line does not name the problem (or that passes silently) is a
defect of towerlib; the known ones carry `defect=...` in bad_inputs.py and are
expected to fail here (strict: once fixed, drop the mark and regenerate the table
with `python tests/checks/bad_inputs.py --write`). Running every case takes about 10 s.
"""

import functools
import importlib.util
import os
import re

import pytest
import tensorflow as tf

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_script():
    spec = importlib.util.spec_from_file_location(
        "bad_inputs_script", os.path.join(REPO_ROOT, "tests", "checks", "bad_inputs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bad_inputs = _load_script()
CASES = bad_inputs.CASES

# First lines that are TensorFlow's, not an answer to the user's mistake.
BARE_TENSORFLOW = re.compile(
    r"^(Graph execution error:|No variables provided\.|End of sequence"
    r"|Unknown attribute .* is encountered while parsing the device spec)")


@functools.lru_cache(maxsize=None)
def outcome(index):
    """The case's Outcome, run once per test process."""
    return bad_inputs.run_case(CASES[index])


def _case_id(index):
    return f"{index:03d}-" + re.sub(r"[^A-Za-z0-9]+", "_", CASES[index].bad_input)[:60]


def _params():
    return [pytest.param(index, id=_case_id(index),
                         marks=[pytest.mark.xfail(strict=True, reason=case.defect)]
                         if case.defect else [])
            for index, case in enumerate(CASES)]


def test_the_table_holds_sixty_distinct_cases_each_naming_its_words():
    assert len(CASES) >= 60
    assert len({(case.bad_input, case.where) for case in CASES}) == len(CASES)
    assert all(case.names for case in CASES), "give every case the words its line must name"


@pytest.mark.parametrize("index", _params())
def test_the_first_line_names_the_option_or_the_problem(index):
    case, got = CASES[index], outcome(index)
    assert got.kind != "nothing", f"{case.bad_input}: passes silently"
    assert got.kind != "logs" or case.info, got
    line = got.first_line
    assert len(line) >= 20, f"{case.bad_input}: first line {line!r}"
    assert not BARE_TENSORFLOW.match(line), f"{case.bad_input}: TensorFlow's {line!r}"
    missing = [word for word in case.names if word not in line]
    assert not missing, f"{case.bad_input}: {line!r} does not name {missing}"


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")),
                    reason="the table was made on a machine without GPUs (messages count them)")
def test_the_ledger_holds_the_section_the_script_prints():
    with open(bad_inputs.LEDGER_MD, encoding="utf-8") as handle:
        held = bad_inputs.section_in_ledger(handle.read())
    assert held is not None, f"tests/faults_ledger.md lacks the section {bad_inputs.SECTION!r}"
    printed = bad_inputs.section([outcome(index) for index in range(len(CASES))])
    assert held == printed, (
        "tests/faults_ledger.md's section of bad inputs is out of date: regenerate it with "
        "`python tests/checks/bad_inputs.py --write`")


def test_the_script_errors_table_reads_every_one_line_error_test():
    rows = bad_inputs.script_errors()
    tests = {test.split("::")[1] for _, _, test in rows}
    assert len(rows) >= 10 and all(command and text for command, text, _ in rows), rows
    assert {"test_train_script_prints_one_clear_error",
            "test_eval_script_refuses_in_one_line"} <= tests, tests
