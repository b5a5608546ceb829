"""ctest's pytest runner (sy_pytest in tests/CMakeLists.txt): pytest's exit status, except
that a run whose tests all passed with some skipped exits 77, which ctest reports as
skipped (SKIP_RETURN_CODE) rather than passed: a Slurm test without root, GPU layouts
without their GPUs, a fault test that cannot mount, an architecture that an older
transformers lacks. The skip reasons are printed (-rs)."""
import sys

import pytest

SKIPPED = 77


class ReportSkips:
    def pytest_sessionfinish(self, session, exitstatus):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if exitstatus == 0 and reporter is not None and reporter.stats.get("skipped"):
            session.exitstatus = SKIPPED


if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-rs", "-p", "no:cacheprovider", *sys.argv[1:]],
                         plugins=[ReportSkips()]))
