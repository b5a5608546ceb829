"""ctest's pytest runner (sy_pytest in tests/CMakeLists.txt): pytest's exit status, except
that a run whose tests all passed with some skipped exits 77, which ctest reports as
skipped (SKIP_RETURN_CODE) rather than passed: a Slurm test without root, GPU layouts
without their GPUs, a fault test that cannot mount, an architecture that an older
transformers lacks. The skip reasons are printed (-rs).

tests/ is the rootdir, whatever the file's area and the working directory, so that pytest
loads tests/conftest.py (with no ini file, pytest would take the file's own directory and
look for conftest.py files no higher)."""
import sys
from pathlib import Path

import pytest

SKIPPED = 77


class ReportSkips:
    def pytest_sessionfinish(self, session, exitstatus):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if exitstatus == 0 and reporter is not None and reporter.stats.get("skipped"):
            session.exitstatus = SKIPPED


if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-rs", "-p", "no:cacheprovider",
                          "--rootdir", str(Path(__file__).resolve().parent), *sys.argv[1:]],
                         plugins=[ReportSkips()]))
