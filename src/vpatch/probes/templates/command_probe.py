"""NNNN-slug: what this probe drives, in one line.

Exit 0: the fix is there. Exit 1: the bug is there. Exit 2: this probe could not decide.
Rules (vpatch reads only the exit code):
- Enter where the server enters: the entry point and the kind of inputs the served engine uses.
- Exit 2 when the API it drives does not take what the scenario needs (check the signatures).
- Before saying "fixed", check that the scenario reached the bug's code path; otherwise exit 2.
- Exit 1 only for "the bug is there", exit 0 only for "the fix is there"; any surprise is exit 2.
"""

import sys


def main() -> int:
    try:
        import vllm  # noqa: F401  # lazy: the tree under test is first on sys.path; a tree without it is exit 2
    except ImportError as exc:
        print(f"cannot import what the probe drives: {exc}")
        return 2
    # 1. check that the API takes what the scenario needs (inspect.signature); else return 2
    # 2. run the scenario through the server's entry point, counting that it reached the bug's code path
    # 3. print what you measured; return 1 when the bug shows, 0 when the fix does
    print("template: the scenario is not written yet")
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # a crash is "could not decide", never "bug found"
        print(f"the probe crashed: {exc!r}")
        sys.exit(2)
