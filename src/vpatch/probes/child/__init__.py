"""Programs that run in another interpreter: the probe venv's warm interpreter (`zygote_server`) and the parent of
a fresh probe run (`supervisor`), run by path. They import the standard library and each other only: vpatch is
not installed where they run, and their folder (sys.path's first entry there) holds nothing else."""

from pathlib import Path

SUPERVISOR = Path(__file__).with_name("supervisor.py")
ZYGOTE_SERVER = Path(__file__).with_name("zygote_server.py")

__all__ = ["SUPERVISOR", "ZYGOTE_SERVER"]
