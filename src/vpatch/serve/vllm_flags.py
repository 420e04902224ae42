"""Prints the vLLM version and every option string its OpenAI server accepts, as one marked JSON line.

Standard library and vLLM only, runnable as a script: `serve/lint.py` hands this very file to the image's own
python3 in a container (no vpatch there), once per image id. vLLM's argument parser moved between releases;
each known home is tried, newest first. Importing it imports vLLM (and torch): seconds, in the container.
"""

import importlib
import json


def main() -> None:
    import vllm  # lazy: run in the image's python, where vLLM is; the module is also read as text by vpatch

    for module in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            make_arg_parser = importlib.import_module(module).make_arg_parser
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise SystemExit("vpatch: no make_arg_parser in this vLLM")
    try:
        parser_class = importlib.import_module("vllm.utils.argparse_utils").FlexibleArgumentParser
    except (ImportError, AttributeError):
        parser_class = importlib.import_module("vllm.utils").FlexibleArgumentParser
    parser = make_arg_parser(parser_class())
    options = sorted({o for action in parser._actions for o in action.option_strings})
    dests = {o: action.dest for action in parser._actions for o in action.option_strings}
    print(MARKER + json.dumps({"version": vllm.__version__, "options": options, "dests": dests}))


MARKER = "VPATCH-VLLM-OPTIONS "

if __name__ == "__main__":
    main()
