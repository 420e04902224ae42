# The overlay recipe of `vpatch build`: the pinned official vLLM image plus only the files the patch
# series adds or changes. vpatch fills the build context (overlay/ holds those files laid out relative
# to the vllm/ package) and the build args; it checks, before this runs, that the base's copies of the
# touched files are the pin's. Build it through `vpatch build`, not by hand.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

# The installed vllm/ package folder, discovered in the base (the official image:
# /usr/local/lib/python3.12/dist-packages/vllm).
ARG VLLM_PACKAGE_DIR

COPY overlay/ ${VLLM_PACKAGE_DIR}/

# Files the series deletes, and the bytecode of every changed or deleted module: a stale .pyc whose
# header still matches would be loaded instead of the patched source. A folder the series empties
# goes too, or python would still import it as a namespace package. Paths relative to the package.
ARG VPATCH_DELETE=""
ARG VPATCH_STALE_MODULES=""
RUN set -eu; cd "${VLLM_PACKAGE_DIR}"; \
    for path in ${VPATCH_DELETE}; do rm -rf -- "$path"; done; \
    for module in ${VPATCH_STALE_MODULES}; do \
        dir=$(dirname -- "$module"); stem=$(basename -- "$module" .py); \
        rm -f -- "$dir/__pycache__/$stem".*.pyc; \
    done; \
    for path in ${VPATCH_DELETE}; do \
        dir=$(dirname -- "$path"); \
        if [ "$dir" != . ] && [ -d "$dir" ] && [ -z "$(ls -A "$dir" | grep -vx __pycache__)" ]; then rm -rf -- "$dir"; fi; \
    done
