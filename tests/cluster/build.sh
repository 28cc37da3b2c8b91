#!/usr/bin/env bash
# Builds the pinned Kubernetes control plane that the k8s tests and `tideshift dev cluster` run:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok and helm, from
# Go modules (there is no Docker here, so no kind/k3d images).
# TIDESHIFT_BUILD_KUBELET=1 adds the kubelet (tests/cluster/real_node.sh: one real node).
#
#   bash tests/cluster/build.sh            # build what is missing, print where it went
#   bash tests/cluster/build.sh --print-bin-dir
#
# Output: ~/.cache/tideshift/k8s-<version>/bin (override with TIDESHIFT_K8S_BIN_DIR).
# A rerun is a no-op when every binary carries a stamp for its pinned version. Each binary is
# linked under a temporary name and renamed into place, then stamped, so an interrupted run
# leaves nothing half-written and the next run resumes with warm Go caches.
set -euo pipefail

# Pins. Each go directive must be satisfied by the local Go (GOTOOLCHAIN=local, Go 1.26):
# k8s v1.36.3 says go 1.26.0, etcd v3.6.16 go 1.26.0, kwok v0.7.0 go 1.24.0, helm v3.22.0
# go 1.26.0. kwok v0.7 ships default node/pod Stages; v0.8 would need them configured.
# services/devcluster/versions.py repeats K8S_VERSION (the default bin dir); a test keeps them equal.
K8S_VERSION="${TIDESHIFT_K8S_VERSION:-v1.36.3}"
ETCD_VERSION="v3.6.16"
KWOK_VERSION="v0.7.0"
HELM_VERSION="v3.22.0"
# Bump when the way a binary is built changes, so stamped binaries get rebuilt.
RECIPE=1

# shellcheck source=tests/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN_DIR="${TIDESHIFT_K8S_BIN_DIR:-$CACHE_ROOT/k8s-$K8S_VERSION/bin}"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
elif [[ $# -gt 0 ]]; then
  echo "usage: bash tests/cluster/build.sh [--print-bin-dir]" >&2
  exit 2
fi

if [[ ! "$K8S_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "build.sh: TIDESHIFT_K8S_VERSION must look like v1.36.3, got '$K8S_VERSION'" >&2
  exit 2
fi
K8S_MINOR="${BASH_REMATCH[1]}"
K8S_PATCH="${BASH_REMATCH[2]}"
# The staging modules (k8s.io/api, k8s.io/apiserver, ...) are published as v0.<minor>.<patch>.
STAGING_VERSION="v0.$K8S_MINOR.$K8S_PATCH"

STARTED=$SECONDS
log() { printf '[build.sh %4ds] %s\n' "$((SECONDS - STARTED))" "$*"; }

declare -A WANT=(
  [etcd]="$ETCD_VERSION"
  [kube-apiserver]="$K8S_VERSION"
  [kube-controller-manager]="$K8S_VERSION"
  [kube-scheduler]="$K8S_VERSION"
  [kubectl]="$K8S_VERSION"
  [kwok]="$KWOK_VERSION"
  [helm]="$HELM_VERSION"
)
NAMES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm)
# The kubelet only for tests/cluster/real_node.sh (one real node), which sets this.
if [[ "${TIDESHIFT_BUILD_KUBELET:-}" == 1 ]]; then
  WANT[kubelet]="$K8S_VERSION"
  NAMES+=(kubelet)
fi
missing=()
for name in "${NAMES[@]}"; do
  is_current "$BIN_DIR" "$name" "${WANT[$name]}" || missing+=("$name")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "Kubernetes $K8S_VERSION binaries are up to date in $BIN_DIR"
  exit 0
fi

go_env build.sh 1.26
WORK_ROOT="$CACHE_ROOT/go/work/k8s-$K8S_VERSION"
mkdir -p "$WORK_ROOT" "$BIN_DIR/.stamps"
# Two builds at once (a person and `make test`) would only fight over the same caches.
take_lock "$CACHE_ROOT/go/build.lock"
make_stage_dir "$BIN_DIR"

log "Go: $(go version); caches under $CACHE_ROOT/go"
log "to build: ${missing[*]} (a cold build takes 10-25 min on 2 cores)"

needs() { # name...
  local name
  for name in "$@"; do
    [[ " ${missing[*]} " == *" $name "* ]] && return 0
  done
  return 1
}
LDFLAGS_STRIP="-s -w"

# etcd: go.etcd.io/etcd/server/v3 has local replaces in its go.mod, so `go install mod@v`
# refuses it; as a dependency of a wrapper module those replaces are ignored.
if needs etcd; then
  dir="$WORK_ROOT/etcd"
  mkdir -p "$dir"
  cat >"$dir/go.mod" <<EOF
module tideshift.local/build/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
  log "building etcd $ETCD_VERSION"
  (cd "$dir" && go build -trimpath -ldflags "$LDFLAGS_STRIP" -o "$STAGE_DIR/etcd" go.etcd.io/etcd/server/v3)
  "$STAGE_DIR/etcd" --version | grep -q "etcd Version: ${ETCD_VERSION#v}" ||
    { echo "build.sh: etcd reports the wrong version:" >&2; "$STAGE_DIR/etcd" --version >&2; exit 1; }
  install_binary "$BIN_DIR" etcd "$ETCD_VERSION" "$STAGE_DIR/etcd"
fi

# Kubernetes: k8s.io/kubernetes requires its staging modules at v0.0.0 with replaces to
# ./staging/src/...; the wrapper points every one of them at the published staging release.
K8S_CMDS=()
for name in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
  needs "$name" && K8S_CMDS+=("$name")
done
if [[ ${#K8S_CMDS[@]} -gt 0 ]]; then
  dir="$WORK_ROOT/kubernetes"
  mkdir -p "$dir"
  log "fetching k8s.io/kubernetes $K8S_VERSION go.mod from the module proxy"
  upstream_mod="$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "$upstream_mod" ]] || { echo "build.sh: could not download k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
  staging=$(sed -n 's|^[[:space:]]*\(k8s\.io/[A-Za-z0-9._/-]*\) => \./staging/.*|\1|p' "$upstream_mod")
  [[ -n "$staging" ]] || { echo "build.sh: no staging replaces found in $upstream_mod" >&2; exit 1; }
  {
    echo "module tideshift.local/build/kubernetes"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for module in $staging; do
      echo "	$module v0.0.0 => $module $STAGING_VERSION"
    done
    echo ")"
  } >"$dir/go.mod.new"
  # Only replace go.mod when it changed, so go.sum from an earlier run stays valid.
  if ! cmp -s "$dir/go.mod.new" "$dir/go.mod.pinned" 2>/dev/null; then
    cp "$dir/go.mod.new" "$dir/go.mod"
    cp "$dir/go.mod.new" "$dir/go.mod.pinned"
    rm -f "$dir/go.sum"
  fi
  rm -f "$dir/go.mod.new"
  log "wrapper module: $(echo "$staging" | wc -w) staging modules replaced with $STAGING_VERSION"

  version_pkg="k8s.io/component-base/version"
  ldflags="$LDFLAGS_STRIP -X $version_pkg.gitVersion=$K8S_VERSION -X $version_pkg.gitMajor=1"
  ldflags+=" -X $version_pkg.gitMinor=$K8S_MINOR -X $version_pkg.gitTreeState=clean"
  ldflags+=" -X $version_pkg.buildDate=1970-01-01T00:00:00Z"
  # client-go keeps its own copy of the version for the kubectl client side.
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$K8S_MINOR"
  pkgs=()
  for name in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
  for name in "${K8S_CMDS[@]}"; do
    log "building $name $K8S_VERSION (the first one also downloads about 1 GB of modules)"
    (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$STAGE_DIR/$name" "k8s.io/kubernetes/cmd/$name")
    reported="$("$STAGE_DIR/$name" --version 2>&1 || true)"
    if [[ "$name" == kubectl ]]; then reported="$("$STAGE_DIR/$name" version --client 2>&1 || true)"; fi
    [[ "$reported" == *"$K8S_VERSION"* ]] ||
      { echo "build.sh: $name reports '$reported', expected $K8S_VERSION" >&2; exit 1; }
    install_binary "$BIN_DIR" "$name" "$K8S_VERSION" "$STAGE_DIR/$name"
  done
fi

# kwok and helm have no local replaces: plain `go install mod/cmd@version` works.
go_install() { # name package version extra-ldflags
  log "building $1 $3"
  GOBIN="$STAGE_DIR" go install -trimpath -ldflags "$LDFLAGS_STRIP $4" "$2@$3"
  install_binary "$BIN_DIR" "$1" "$3" "$STAGE_DIR/$1"
}
if needs kwok; then
  go_install kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" ""
fi
if needs helm; then
  go_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
fi

log "done: Kubernetes $K8S_VERSION binaries in $BIN_DIR"
# CPU seconds of the Go toolchain (user, then system), to compare builds across machines.
times >"$STAGE_DIR/cpu-times"
log "CPU time of the Go toolchain (user system): $(tail -n 1 "$STAGE_DIR/cpu-times")"
