#!/usr/bin/env python3
"""Stand-ins for what the rebuild job calls, for tests/project/test_workflows.py: copied as `scripts/ci-rebuild`
into the job's workspace and as `gh` onto its PATH, told by the test's environment what to do. The real
scripts/ci-rebuild needs upstream, docker and a registry (tests/cli/test_ci_rebuild.py tests it on its own);
the real gh needs GitHub. Each call is logged (program, arguments, whether it saw a token) to STANDIN_LOG.

ci-rebuild: prints the summary in STANDIN_SUMMARY (a JSON file; none: prints nothing, as a crash would) and
exits with STANDIN_EXIT. A summary whose "commit" is "new" gets a real commit in the workspace first, its
subject and body from the summary's "subject" and "body" (which are then left out), as `vpatch update` commits.
gh: exits with STANDIN_GH_EXIT (default 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def log(program: str) -> None:
    entry = {"program": program, "argv": sys.argv[1:], "token": bool(os.environ.get("GH_TOKEN"))}
    with open(os.environ["STANDIN_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def ci_rebuild() -> int:
    log("ci-rebuild")
    if not os.environ.get("STANDIN_SUMMARY"):
        print("ci-rebuild: stand-in crashed before its summary", file=sys.stderr)
        return int(os.environ["STANDIN_EXIT"])
    summary = json.loads(Path(os.environ["STANDIN_SUMMARY"]).read_text(encoding="utf-8"))
    if summary["commit"] == "new":
        subject, body = summary.pop("subject"), summary.pop("body")
        subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", subject, "-m", body], check=True)
        summary["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], check=True, capture_output=True,
                                           text=True).stdout.strip()
    print(json.dumps(summary, indent=2))
    return int(os.environ["STANDIN_EXIT"])


def gh() -> int:
    log("gh")
    return int(os.environ.get("STANDIN_GH_EXIT", "0"))


if __name__ == "__main__":
    sys.exit({"ci-rebuild": ci_rebuild, "gh": gh}[Path(sys.argv[0]).name]())
