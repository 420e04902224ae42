"""Programs that run in another interpreter, run by path: the probe venv's warm interpreter (`zygote_server`), the
parent of a fresh probe run (`supervisor`) and upstream's tests' pytest (`upstream_tests`). They import the standard
library and each other only (and `upstream_tests` pytest, which it runs): vpatch is not installed where they run,
and their folder (sys.path's first entry there) holds nothing else."""

from pathlib import Path

SUPERVISOR = Path(__file__).with_name("supervisor.py")
UPSTREAM_TESTS = Path(__file__).with_name("upstream_tests.py")
ZYGOTE_SERVER = Path(__file__).with_name("zygote_server.py")

__all__ = ["SUPERVISOR", "UPSTREAM_TESTS", "ZYGOTE_SERVER"]
