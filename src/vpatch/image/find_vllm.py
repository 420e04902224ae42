"""Prints where the vllm package is installed, without importing it (importing it pulls in torch); nothing when
it is not importable.

Standard library only, runnable as a script: `image/base.py` hands this very file to the base image's own python3
in a container (no vpatch there), once per base image id.
"""

import importlib.util


def main() -> None:
    spec = importlib.util.find_spec("vllm")
    places = spec.submodule_search_locations if spec is not None else None
    print(next(iter(places)) if places else "")


if __name__ == "__main__":
    main()
