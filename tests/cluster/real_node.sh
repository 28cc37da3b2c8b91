#!/usr/bin/env bash
# The chart's services as real pods on real nodes: tests/cluster/real/cluster.sh's cluster (inside
# network namespaces of its own; nothing on the host's network changes), `helm install` with the
# bundled NATS (its image made from the venv's nats-server), then a labelled Deployment of 5
# real pods that the pipeline scales down to the 2 its load needs.
#
#   sudo bash tests/cluster/real_node.sh up [--nodes N]   # default 1 node; ~1 min warm
#   sudo bash tests/cluster/real_node.sh down             # helm uninstall, then cluster.sh down
#
# Needs root, the images of `make image`; cluster.sh builds the kubelet, kube-proxy and CoreDNS
# when missing. tests/cluster/real/README.md describes the cluster.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER=(bash "$REPO/tests/cluster/real/cluster.sh")
BIN_DIR="$(bash "$REPO/tests/cluster/build.sh" --print-bin-dir)"
IMAGE="${TIDESHIFT_IMAGE:-localhost/tideshift:dev}"
PREDICTOR_IMAGE="${TIDESHIFT_PREDICTOR_IMAGE:-localhost/tideshift-predictor:dev}"
PAUSE_IMAGE="localhost/tideshift-real-pause:1"
HELM="$BIN_DIR/helm"

log() { printf '[real_node.sh %s] %s\n' "$(date +%T)" "$*"; }
die() { echo "real_node.sh: $*" >&2; exit 1; }

wait_for() { # seconds description command...
  local seconds=$1 what=$2
  local deadline=$((SECONDS + seconds))
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after $seconds s waiting for $what"
    sleep 1
  done
}

install_chart() {
  local nats_image values
  nats_image=$("${CLUSTER[@]}" nats-image)
  values=$(mktemp)
  cat >"$values" <<EOF
image: {repository: ${IMAGE%:*}, tag: ${IMAGE##*:}, pullPolicy: Never}
nats:
  bundled:
    image: {repository: ${nats_image%:*}, tag: "${nats_image##*:}", pullPolicy: Never}
    persistence: {enabled: false} # no storage provisioner in this cluster
predictor:
  image: {repository: ${PREDICTOR_IMAGE%:*}, tag: ${PREDICTOR_IMAGE##*:}}
  config:
    metric_source: sim
    sim_peak_rps: 150
    sim_trough_rps: 150
    workloads: [{namespace: default, name: web}]
planner: {config: {tick_seconds: 1}}
EOF
  "$HELM" install tideshift "$REPO/charts/tideshift" -f "$values" --wait --timeout 5m
  rm -f "$values"
  "${KUBECTL[@]}" get pods -o wide
}

replicas_are() { [[ "$("${KUBECTL[@]}" get deployment web -o jsonpath='{.spec.replicas}')" == "$1" ]]; }

scale_demo() { # a labelled Deployment of 5 real pods; 150 rps at 100 a replica needs 2
  "${KUBECTL[@]}" apply -f - <<EOF
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {tideshift.io/role: serving}
  annotations:
    tideshift.io/capacity-rps: "100"
    tideshift.io/min-replicas: "1"
    tideshift.io/lead-time-seconds: "0"
    tideshift.io/stabilization-seconds: "1"
spec:
  replicas: 5
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: "$PAUSE_IMAGE", imagePullPolicy: Never}]
EOF
  wait_for 120 "web scaled to 2 by the executor's pod" replicas_are 2
  "${KUBECTL[@]}" get events --field-selector involvedObject.name=web,reason=TideshiftScaled
}

use_cluster() { # kubectl's and helm's caches and settings in the cluster's state dir
  KUBECONFIG=$("${CLUSTER[@]}" kubeconfig)
  local state
  state=$(dirname "$KUBECONFIG")
  KUBECTL=("$BIN_DIR/kubectl" --cache-dir "$state/kube-cache")
  export KUBECONFIG HELM_CACHE_HOME="$state/helm/cache" HELM_CONFIG_HOME="$state/helm/config" \
    HELM_DATA_HOME="$state/helm/data"
}

up() {
  "${CLUSTER[@]}" up "$@"
  use_cluster
  log "helm install: the chart's services as pods"
  install_chart
  scale_demo
  log "up: export KUBECONFIG=$KUBECONFIG; 'bash $0 down' stops it"
}

down() {
  use_cluster
  if [[ -f "$KUBECONFIG" ]]; then
    "$HELM" uninstall tideshift --wait --timeout 60s >/dev/null 2>&1 || true
  fi
  "${CLUSTER[@]}" down
}

case "${1:-}" in
up) shift && up "$@" ;;
down) down ;;
*) echo "usage: bash tests/cluster/real_node.sh up [--nodes N] | down" >&2; exit 2 ;;
esac
