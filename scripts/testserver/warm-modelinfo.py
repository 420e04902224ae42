"""Write vLLM's model-info cache for the tiny model's architecture, as a server writes it at its first start.

Every `vllm serve` first inspects the model class in a subprocess of its own (a whole torch and vLLM import,
8.5 s of a 32 s start on the quiet 2-core machine: "Registry inspect model class" at debug level) unless
VLLM_CACHE_ROOT/modelinfos holds the class's info under the hash of its source file. A production host keeps
that folder between starts; a test container starts from the image every time, so the image carries it.
Run with the image's venv before it is moved (the hash covers the file's bytes, not its path):

    VLLM_CACHE_ROOT=DIR python warm-modelinfo.py ARCHITECTURE
"""

import os
import sys
from pathlib import Path

from vllm.model_executor.models.registry import ModelRegistry

architecture = sys.argv[1]
info = ModelRegistry.models[architecture].inspect_model_cls()
assert info.architecture == architecture, info
written = list((Path(os.environ["VLLM_CACHE_ROOT"]) / "modelinfos").glob(f"*-{architecture}.json"))
assert len(written) == 1, f"no model-info cache file for {architecture} was written: {written}"
print(written[0].name, file=sys.stderr)
