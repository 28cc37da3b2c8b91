#!/usr/bin/env bash
# Builds the engines users run beside Tideshift, for the local control plane
# (`tideshift dev cluster up` and the k8s test tier): Kueue's manager, the Kubeflow training
# operator and the KubeRay operator, from Go modules like tests/cluster/build.sh builds the
# Kubernetes binaries, and copies each one's CRDs and webhook manifests out of its module.
# Volcano is not served by the module proxy here, so it keeps its structural CRD.
#
#   bash tests/cluster/build_engines.sh            # build what is missing, print where it went
#   bash tests/cluster/build_engines.sh --print-dir
#
# Output: ~/.cache/tideshift/engines/{bin,manifests} (override with TIDESHIFT_ENGINES_DIR).
# A rerun is a no-op when every binary and manifest set carries a stamp for its pinned version.
# Each binary is linked under a temporary name and renamed into place, then stamped; manifests
# are copied into a temporary directory and renamed into place, so an interrupted run leaves
# nothing half-written.
set -euo pipefail

# Pins. services/devcluster/engines.py repeats them (a test keeps them equal). Each go directive
# is satisfied by the local Go (GOTOOLCHAIN=local): kueue v0.17.0 says go 1.25.0, the training
# operator v1.8.1 go 1.22, KubeRay's ray-operator v1.5.0 go 1.24.0.
KUEUE_VERSION="v0.17.0"
TRAINING_OPERATOR_VERSION="v1.8.1"
KUBERAY_VERSION="v1.5.0"
# Bump when the way a binary or a manifest set is produced changes, so stamped ones get redone.
RECIPE=1

# shellcheck source=tests/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ENGINES_DIR="${TIDESHIFT_ENGINES_DIR:-$CACHE_ROOT/engines}"
BIN_DIR="$ENGINES_DIR/bin"
MANIFEST_DIR="$ENGINES_DIR/manifests"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$ENGINES_DIR"
  exit 0
elif [[ $# -gt 0 ]]; then
  echo "usage: bash tests/cluster/build_engines.sh [--print-dir]" >&2
  exit 2
fi

STARTED=$SECONDS
log() { printf '[build_engines.sh %4ds] %s\n' "$((SECONDS - STARTED))" "$*"; }

# engine name -> binary name, Go module, package to build, version
ENGINES=(kueue training-operator kuberay)
declare -A BINARY=([kueue]=kueue [training-operator]=training-operator [kuberay]=kuberay-operator)
declare -A MODULE=(
  [kueue]=sigs.k8s.io/kueue
  [training-operator]=github.com/kubeflow/training-operator
  [kuberay]=github.com/ray-project/kuberay/ray-operator
)
declare -A PACKAGE=(
  [kueue]=sigs.k8s.io/kueue/cmd/kueue
  [training-operator]=github.com/kubeflow/training-operator/cmd/training-operator.v1
  [kuberay]=github.com/ray-project/kuberay/ray-operator
)
declare -A VERSION=(
  [kueue]="$KUEUE_VERSION"
  [training-operator]="$TRAINING_OPERATOR_VERSION"
  [kuberay]="$KUBERAY_VERSION"
)
# A flag each binary's --help must list: proof that the right program was built.
declare -A HELP_FLAG=([kueue]=-config [training-operator]=-enable-scheme [kuberay]=-metrics-addr)

binary_current() { # engine
  is_current "$BIN_DIR" "${BINARY[$1]}" "${VERSION[$1]}"
}
manifests_current() { # engine
  [[ -d "$MANIFEST_DIR/$1" ]] && stamped "$MANIFEST_DIR/.stamps/$1" "$1" "${VERSION[$1]}"
}

missing=()
for engine in "${ENGINES[@]}"; do
  if ! binary_current "$engine" || ! manifests_current "$engine"; then
    missing+=("$engine")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "engines (kueue $KUEUE_VERSION, training-operator $TRAINING_OPERATOR_VERSION," \
    "kuberay $KUBERAY_VERSION) are up to date in $ENGINES_DIR"
  exit 0
fi

go_env build_engines.sh 1.25
WORK_DIR="$CACHE_ROOT/go/work/engines"
mkdir -p "$WORK_DIR" "$BIN_DIR/.stamps" "$MANIFEST_DIR/.stamps"
# Its own lock: build.sh may run at the same time (Go's caches are safe to share).
take_lock "$CACHE_ROOT/go/engines.lock"
make_stage_dir "$ENGINES_DIR"

log "Go: $(go version); caches under $CACHE_ROOT/go"
log "to build: ${missing[*]} (a cold build takes 10-30 min on 2 cores)"

module_dir() { # module version -> the unpacked module source in GOMODCACHE
  local dir
  dir="$(cd "$WORK_DIR" && go mod download -json "$1@$2" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -d "$dir" ]] || {
    echo "build_engines.sh: could not download $1@$2 from the module proxy" >&2
    exit 1
  }
  echo "$dir"
}

copy_manifests() { # engine source-dir target-dir
  local engine="$1" src="$2" out="$3"
  mkdir -p "$out/crds" "$out/webhooks"
  case "$engine" in
    kueue)
      cp "$src"/config/components/crd/bases/*.yaml "$out/crds/"
      cp "$src/config/components/webhook/manifests.yaml" "$out/webhooks/manifests.yaml"
      ;;
    training-operator)
      cp "$src"/manifests/base/crds/kubeflow.org_*.yaml "$out/crds/"
      cp "$src/manifests/base/webhook/manifests.yaml" "$out/webhooks/manifests.yaml"
      ;;
    kuberay)
      # KubeRay's webhooks are optional (ENABLE_WEBHOOKS=true); copied for reference.
      cp "$src"/config/crd/bases/*.yaml "$out/crds/"
      cp "$src/config/webhook/manifests.yaml" "$out/webhooks/manifests.yaml"
      ;;
  esac
  local count
  count=$(find "$out/crds" -name '*.yaml' | wc -l)
  [[ "$count" -gt 0 ]] || {
    echo "build_engines.sh: no CRDs found for $engine in $src" >&2
    exit 1
  }
  echo "$engine ${VERSION[$engine]} from ${MODULE[$engine]}" >"$out/SOURCE"
}

for engine in "${missing[@]}"; do
  version="${VERSION[$engine]}"
  binary="${BINARY[$engine]}"
  if ! manifests_current "$engine"; then
    src="$(module_dir "${MODULE[$engine]}" "$version")"
    rm -rf "$STAGE_DIR/manifests-$engine"
    copy_manifests "$engine" "$src" "$STAGE_DIR/manifests-$engine"
    rm -rf "$MANIFEST_DIR/$engine.old"
    [[ -d "$MANIFEST_DIR/$engine" ]] && mv "$MANIFEST_DIR/$engine" "$MANIFEST_DIR/$engine.old"
    mv "$STAGE_DIR/manifests-$engine" "$MANIFEST_DIR/$engine"
    rm -rf "$MANIFEST_DIR/$engine.old"
    write_stamp "$MANIFEST_DIR/.stamps/$engine" "$engine" "$version"
    log "copied $engine $version CRDs and webhook manifests to $MANIFEST_DIR/$engine"
  fi
  if ! binary_current "$engine"; then
    log "building $binary $version (${PACKAGE[$engine]})"
    mkdir -p "$STAGE_DIR/gobin-$engine"
    GOBIN="$STAGE_DIR/gobin-$engine" go install -trimpath -ldflags "-s -w" "${PACKAGE[$engine]}@$version"
    built="$(find "$STAGE_DIR/gobin-$engine" -maxdepth 1 -type f -perm -u+x | head -n 1)"
    [[ -n "$built" ]] || {
      echo "build_engines.sh: go install ${PACKAGE[$engine]}@$version produced no binary" >&2
      exit 1
    }
    help="$("$built" --help 2>&1 || true)"
    [[ "$help" == *"${HELP_FLAG[$engine]}"* ]] || {
      echo "build_engines.sh: $built --help does not list ${HELP_FLAG[$engine]}:" >&2
      echo "$help" | head -n 20 >&2
      exit 1
    }
    install_binary "$BIN_DIR" "$binary" "$version" "$built"
  fi
done

log "done: engines in $ENGINES_DIR"
times >"$STAGE_DIR/cpu-times"
log "CPU time of the Go toolchain (user system): $(tail -n 1 "$STAGE_DIR/cpu-times")"
