# shellcheck shell=bash
# Common environment for the gpufleet.inference controller scripts. Source it; do not run it.
# Every path the scripts write outside the checkout lives under GPUFLEET_CACHE, keyed by the
# content hash of what built it, so a fresh clone (CI) reuses venvs and images.

GPUFLEET_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GPUFLEET_CACHE=${GPUFLEET_CACHE:-/var/cache/gpufleet}
GPUFLEET_PYTHON=${GPUFLEET_PYTHON:-python3.11}
export GPUFLEET_REPO GPUFLEET_CACHE GPUFLEET_PYTHON

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

# content hash of files (paths relative to the repo), short
content_hash() {
    (cd "$GPUFLEET_REPO" && cat "$@") | sha256sum | cut -c1-16
}

gpufleet_env() {
    export VIRTUAL_ENV="$GPUFLEET_REPO/.venv"
    export PATH="$VIRTUAL_ENV/bin:$PATH"
    export ANSIBLE_CONFIG="$GPUFLEET_REPO/ansible.cfg"
    export CONTAINERS_CONF="$GPUFLEET_CACHE/containers.conf"
    export ANSIBLE_COLLECTIONS_PATH="$GPUFLEET_REPO/.collections"
    # Molecule and ansible-lint install "the project's collection" into $ANSIBLE_HOME/collections
    # unless a link there already points at the checkout: keep that per checkout (bootstrap
    # makes the link) so no stale copy under ~/.ansible ever shadows the working tree.
    export ANSIBLE_HOME="$GPUFLEET_REPO/.ansible"
    export LC_ALL=C.UTF-8 LANG=C.UTF-8
    export PYTHONDONTWRITEBYTECODE=1
}
