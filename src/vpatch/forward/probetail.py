# The probe above as a pytest test (appended by `vpatch forward`): its main() run from the tree's root, where the
# probe runs; exit 0 passes, 1 (the bug is there) and 2 (it could not reach the code it checks) fail.


def test_probe() -> None:
    import os  # lazy: inside the test, so that appending it leaves the module's imports as they were
    from pathlib import Path  # lazy: inside the test, so that appending it leaves the module's imports as they were

    root = next(p for p in Path(__file__).resolve().parents if (p / "vllm" / "__init__.py").is_file())
    here = os.getcwd()
    os.chdir(root)
    try:
        code = globals()["main"]()
    finally:
        os.chdir(here)
    assert code != 2, "the test could not reach the code path it checks: see its output"
    assert code == 0, "the bug is there: see its output"
