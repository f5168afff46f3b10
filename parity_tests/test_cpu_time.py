"""`parity_tests.cpu_time`, the plugin that says where the suite's CPU time goes: a nested pytest
run (pytester, in this process) of two tests, one busy in its own process and one in a subprocess
it waits for; each is charged to the right column and module."""
import re

pytest_plugins = ["pytester"]

BUSY = """
import subprocess, sys, time

def _spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_own():
    _spin(0.3)

def test_subprocess():
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.3\\n"
                    "while time.process_time() < end: pass"], check=True)
"""


def test_each_test_is_charged_its_own_and_its_subprocesses_cpu_time(pytester):
    pytester.makepyfile(test_busy=BUSY, test_idle="def test_nothing():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "parity_tests.cpu_time", "-p", "no:cacheprovider",
                                          "--cpu-top", "2")
    result.assert_outcomes(passed=3)
    text = result.stdout.str()
    rows = {m.group(1): (int(m.group(2)), float(m.group(3)), float(m.group(4)))
            for m in re.finditer(r"^(test_\w+\.py) +(\d+) +([\d.]+) +([\d.]+) +[\d.]+%$", text, re.M)}
    assert rows.keys() == {"test_busy.py", "test_idle.py"}, text
    tests, own, children = rows["test_busy.py"]
    assert tests == 2 and own >= 0.3 and children >= 0.3, text
    assert rows["test_idle.py"][0] == 1 and rows["test_idle.py"][2] == 0.0, text
    heaviest = re.findall(r"^ +([\d.]+)  (\S+)$", text, re.M)
    assert [name for _, name in heaviest] and len(heaviest) == 2, text
    assert {name for _, name in heaviest} == {"test_busy.py::test_own", "test_busy.py::test_subprocess"}, text
