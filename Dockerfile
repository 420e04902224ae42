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
# goes too, or python would still import it as a namespace package. Paths relative to the package,
# one a line, read line by line and always quoted: a space or a glob character in a name stays literal.
ARG VPATCH_DELETE=""
ARG VPATCH_STALE_MODULES=""
RUN set -eu; cd "${VLLM_PACKAGE_DIR}"; \
    printf '%s\n' "${VPATCH_DELETE}" | while IFS= read -r path; do \
        if [ -n "$path" ]; then rm -rf -- "./$path"; fi; \
    done; \
    printf '%s\n' "${VPATCH_STALE_MODULES}" | while IFS= read -r module; do \
        if [ -z "$module" ]; then continue; fi; \
        dir=$(dirname -- "$module"); stem=$(basename -- "$module" .py); \
        for pyc in "$dir/__pycache__/$stem".*.pyc; do rm -f -- "$pyc"; done; \
    done; \
    printf '%s\n' "${VPATCH_DELETE}" | while IFS= read -r path; do \
        if [ -z "$path" ]; then continue; fi; \
        dir=$(dirname -- "$path"); \
        if [ "$dir" != . ] && [ -d "$dir" ] && [ -z "$(ls -A -- "$dir" | grep -vx __pycache__)" ]; then rm -rf -- "$dir"; fi; \
    done
