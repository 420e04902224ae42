# The probe above as a pytest test (appended by `vpatch forward`): its main()
# run from the tree's root, where the probe runs; exit 0 passes, 1 (the bug is
# there) and 2 (it could not reach the code it checks) fail.


def test_probe() -> None:
    import os  # lazy: in the test, so the module's own imports stay as they are
    from pathlib import Path  # lazy: in the test, as above

    here = Path(__file__).resolve()
    root = next(p for p in here.parents if (p / "vllm" / "__init__.py").is_file())
    cwd = os.getcwd()
    os.chdir(root)
    try:
        code = globals()["main"]()
    finally:
        os.chdir(cwd)
    assert code != 2, "the test could not reach the code path it checks"
    assert code == 0, "the bug is there: see its output"
