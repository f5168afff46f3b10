"""`twins` run in the test's own process, for the tests of the command line."""
from __future__ import annotations

from twins.cli import main


def cli(capsys, *argv) -> tuple[int, str, str]:
    """``twins ARGV`` in this process: (exit status, stdout, stderr); a usage error that argparse
    reports (exit 2, by SystemExit) is returned as the others are."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err
