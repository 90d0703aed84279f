#!/usr/bin/env bash
# ./reproduce.sh [--profile laptop|paper|gpu] [NOTEBOOK...]   run every (or the named) notebook, write results/
# ./reproduce.sh test [PYTEST ARGS...]                        run the test suite
# ./reproduce.sh test-mcore 0.15 [PYTEST ARGS...]              the runtime and integration tests on megatron-core
#                                                              0.15.3 in .venv-mcore015 (CI's second release)
# Both first make sure .venv holds the tested environment (constraints.txt); a second run skips the install.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.relibra-installed

fingerprint() { cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1; }

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        echo "[setup] creating $VENV"
        "$PY" -m venv "$VENV"
    fi
    if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$(fingerprint)" ]; then
        echo "[setup] installing the tested versions (constraints.txt) into $VENV (first run takes a few minutes)"
        # torch first and exactly pinned, so nothing can pull a CUDA build in its place.
        "$VENV/bin/python" -m pip install --quiet -c constraints.txt torch==2.13.0
        # pyproject.toml declares ranges; constraints.txt holds the exact versions the kit is tested with.
        "$VENV/bin/python" -m pip install --quiet -c constraints.txt -e ".[notebooks,test]"
        "$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 >/dev/null
        fingerprint > "$STAMP"
    fi
    # JupyterLab: double-clicking a notebook's .py source opens it as a notebook (Jupytext's viewer), a
    # setting of this environment only (its app settings), never of the user's own JupyterLab.
    mkdir -p "$VENV/share/jupyter/lab/settings/overrides.d"
    cp notebooks/jupyterlab-overrides.json "$VENV/share/jupyter/lab/settings/overrides.d/relibra.json"
}

# The browser test (tests/test_browser.py) drives JupyterLab in Debian's Chromium through Selenium and
# /usr/bin/chromedriver: no browser download (selenium comes with the `test` extra). Without apt or
# root the test skips and says why.
browser_setup() {
    if { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; } && command -v apt-get >/dev/null \
            && [ "$(id -u)" = 0 ]; then
        echo "[setup] installing Debian's chromium and chromium-driver for the browser test"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
            >/dev/null || echo "[setup] apt-get could not install chromium: the browser test will skip"
    fi
}

# A second megatron-core release in its own environment: torch and every other pin from constraints.txt,
# megatron-core 0.15.3 instead of the pinned 0.16.1. megatron-core 0.15's wheel declares numpy<2 (the
# kit needs numpy>=2), so it goes in with --no-deps, as verl's images install megatron-core
# (docker/Dockerfile.stable.vllm: pip install --no-deps); its other requirements (torch, packaging) are there.
MCORE_RELEASES="0.15:0.15.3"
MCORE_TESTS="tests/test_integration_spec.py tests/test_integration_replay.py tests/test_integration_docs.py
tests/test_stack_replay.py tests/test_runtime.py tests/test_megatron_ddp.py tests/test_grouped_experts.py
tests/test_runtime_pipeline.py tests/test_runtime_recipes.py"
mcore_setup() {
    local line=$1 version=""
    for pair in $MCORE_RELEASES; do [ "${pair%%:*}" = "$line" ] && version=${pair#*:}; done
    if [ -z "$version" ]; then echo "error: test-mcore takes one of: ${MCORE_RELEASES//:*/} (got '$line')" >&2; exit 2; fi
    MVENV=.venv-mcore${line//./}
    local stamp=$MVENV/.relibra-installed want
    want="$version $(fingerprint)"
    if [ ! -x "$MVENV/bin/python" ]; then "$PY" -m venv "$MVENV"; fi
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        echo "[setup] installing megatron-core $version and the tested versions of the rest into $MVENV"
        "$MVENV/bin/python" -m pip install --quiet -c constraints.txt torch==2.13.0
        "$MVENV/bin/python" -m pip install --quiet --no-deps "megatron-core==$version"
        "$MVENV/bin/python" -m pip install --quiet --no-deps -e .
        "$MVENV/bin/python" -m pip install --quiet -c constraints.txt packaging numpy scipy pandas tqdm pytest \
            pytest-xdist hypothesis
        echo "$want" > "$stamp"
    fi
}

if [ "${1:-}" = "test-mcore" ]; then
    mcore_setup "${2:-}"
    shift 2
    export PYTHONHASHSEED=0 MPLBACKEND=Agg
    # shellcheck disable=SC2086
    exec "$MVENV/bin/python" -m pytest -n "${RELIBRA_TEST_WORKERS:-2}" --dist loadfile $MCORE_TESTS "$@"
fi
setup
if [ "${1:-}" = "test" ]; then
    browser_setup
fi
export PYTHONHASHSEED=0 MPLBACKEND=Agg
if [ "${1:-}" = "test" ]; then
    shift
    # one worker process per core, each test file inside one worker (RELIBRA_TEST_WORKERS=0: in this process)
    exec "$VENV/bin/python" -m pytest -n "${RELIBRA_TEST_WORKERS:-2}" --dist loadfile "$@"
fi
exec "$VENV/bin/python" -m relibra reproduce "$@"
