#!/usr/bin/env bash
# Builds what the real cluster (tests/cluster/real/cluster.sh) adds to build.sh's control plane:
#  * the kubelet (build.sh itself, TIDESHIFT_BUILD_KUBELET=1) and kube-proxy, from the same
#    Kubernetes wrapper module, version and ldflags, into build.sh's bin dir with its stamps;
#  * CoreDNS v1.15.0 with only the plugins the cluster's Corefile names (the full plugin set
#    pulls in every cloud SDK and triples the build);
#  * a tiny static "pause" program for the pod sandbox image (no registry is reachable).
#
#   bash tests/cluster/real/build.sh            # build what is missing
#   bash tests/cluster/real/build.sh --print-dirs
#
# A rerun is a no-op when every binary carries its stamp. Shares build.sh's Go caches and lock.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
K8S_BIN_DIR="$(bash "$REPO/tests/cluster/build.sh" --print-bin-dir)"
K8S_VERSION="${TIDESHIFT_K8S_VERSION:-v1.36.3}"
COREDNS_VERSION="v1.15.0"
# Bump when the way a binary here is built changes.
RECIPE=1
REAL_BIN_DIR="$CACHE_ROOT/real-cluster-bin"

if [[ "${1:-}" == "--print-dirs" ]]; then
  echo "$K8S_BIN_DIR $REAL_BIN_DIR"
  exit 0
elif [[ $# -gt 0 ]]; then
  echo "usage: bash tests/cluster/real/build.sh [--print-dirs]" >&2
  exit 2
fi

STARTED=$SECONDS
log() { printf '[real/build.sh %4ds] %s\n' "$((SECONDS - STARTED))" "$*"; }

# 1. the kubelet: build.sh already knows how.
TIDESHIFT_BUILD_KUBELET=1 bash "$REPO/tests/cluster/build.sh"

need_proxy=1 need_coredns=1 need_pause=1
is_current "$K8S_BIN_DIR" kube-proxy "$K8S_VERSION" && need_proxy=0
is_current "$REAL_BIN_DIR" coredns "$COREDNS_VERSION" && need_coredns=0
is_current "$REAL_BIN_DIR" pause 1 && need_pause=0
if ((need_proxy + need_coredns + need_pause == 0)); then
  echo "kube-proxy, coredns and pause are up to date"
  exit 0
fi

go_env real/build.sh 1.26
mkdir -p "$REAL_BIN_DIR/.stamps"
take_lock "$CACHE_ROOT/go/build.lock"
make_stage_dir "$REAL_BIN_DIR"

# 2. kube-proxy in build.sh's wrapper module (it wrote go.mod when it built the kubelet).
if ((need_proxy)); then
  dir="$CACHE_ROOT/go/work/k8s-$K8S_VERSION/kubernetes"
  [[ -f "$dir/go.mod" ]] || { echo "real/build.sh: $dir/go.mod missing (build.sh failed?)" >&2; exit 1; }
  [[ "$K8S_VERSION" =~ ^v1\.([0-9]+)\. ]]
  minor="${BASH_REMATCH[1]}"
  v="k8s.io/component-base/version"
  ldflags="-s -w -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor"
  ldflags+=" -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
  log "building kube-proxy $K8S_VERSION"
  (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$STAGE_DIR/kube-proxy" k8s.io/kubernetes/cmd/kube-proxy)
  [[ "$("$STAGE_DIR/kube-proxy" --version 2>&1)" == *"$K8S_VERSION"* ]] ||
    { echo "real/build.sh: kube-proxy reports the wrong version" >&2; exit 1; }
  install_binary "$K8S_BIN_DIR" kube-proxy "$K8S_VERSION" "$STAGE_DIR/kube-proxy"
fi

# 3. CoreDNS: our own main importing the server and the handful of plugins we configure.
if ((need_coredns)); then
  dir="$CACHE_ROOT/go/work/coredns-$COREDNS_VERSION"
  mkdir -p "$dir"
  cat >"$dir/go.mod" <<EOF
module tideshift.local/build/coredns

go 1.26.0

require github.com/coredns/coredns $COREDNS_VERSION
EOF
  cat >"$dir/main.go" <<'EOF'
// CoreDNS with the plugins the real test cluster's Corefile uses, and nothing else.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
EOF
  log "building coredns $COREDNS_VERSION (trimmed plugin set)"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$STAGE_DIR/coredns" .)
  "$STAGE_DIR/coredns" -plugins | grep -qw 'kubernetes' ||
    { echo "real/build.sh: coredns lacks the kubernetes plugin" >&2; exit 1; }
  install_binary "$REAL_BIN_DIR" coredns "$COREDNS_VERSION" "$STAGE_DIR/coredns"
fi

# 4. pause: holds the pod's namespaces, reaps zombies, exits on SIGTERM/SIGINT.
if ((need_pause)); then
  dir="$CACHE_ROOT/go/work/pause"
  mkdir -p "$dir"
  printf 'module tideshift.local/build/pause\n\ngo 1.26.0\n' >"$dir/go.mod"
  cat >"$dir/main.go" <<'EOF'
// The pod sandbox's only process: wait for a stop signal, reaping orphans meanwhile.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
EOF
  log "building pause"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$STAGE_DIR/pause" .)
  install_binary "$REAL_BIN_DIR" pause 1 "$STAGE_DIR/pause"
fi
log "done: $K8S_BIN_DIR, $REAL_BIN_DIR"
