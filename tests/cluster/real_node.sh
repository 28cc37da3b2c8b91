#!/usr/bin/env bash
# One real node beside the local control plane: a kubelet built from the same Kubernetes module
# as build.sh's binaries, Debian's containerd (1.6) and runc, so `helm install` runs the chart's
# services as real pods, and the pipeline scales a real Deployment.
#
#   bash tests/cluster/real_node.sh up     # ~1 min warm; the first run also builds the kubelet
#   bash tests/cluster/real_node.sh down   # stops what `up` started, removes its iptables rule
#
# Needs root, build.sh's binaries (make k8s-binaries) and the image (make image). Everything
# lives in $TIDESHIFT_CACHE_DIR/real-node (default ~/.cache/tideshift/real-node): its own
# control plane (`tideshift dev cluster` with no kwok nodes), containerd's store and socket,
# the kubelet's root. What this machine needed, and why (tests/cluster/README.md has more):
#  * containerd: restrict_oom_score_adj, or runc dies on the sandbox's oom_score_adj of -998
#    ("can't get final child's PID from pipe: EOF"; a negative score is refused here);
#  * kubelet: failCgroupV1: false (cgroup v1 hosts are refused by default since 1.35),
#    cgroupfs (no systemd), a node IP that is not loopback;
#  * the sandbox ("pause") image is made from the local Debian base: no registry is reachable;
#  * no kube-proxy and no cluster DNS: the in-cluster API address 10.96.0.1:443 is DNATed to
#    the loopback-only apiserver for this node's pod subnet (the Endpoints of `kubernetes` may
#    not hold a loopback address, so kube-proxy could not do it), and NATS runs on the host's
#    address: the chart's bundled NATS and `helm test` need Service DNS names.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE_ROOT="${TIDESHIFT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tideshift}"
WORK="$CACHE_ROOT/real-node"
BIN_DIR="$(bash "$REPO/tests/cluster/build.sh" --print-bin-dir)"
IMAGE="${TIDESHIFT_IMAGE:-localhost/tideshift:dev}"
PREDICTOR_IMAGE="${TIDESHIFT_PREDICTOR_IMAGE:-localhost/tideshift-predictor:dev}"
PAUSE_IMAGE="localhost/tideshift-pause:1"
NODE="${TIDESHIFT_NODE_NAME:-tideshift-real-0}"
POD_SUBNET="10.244.77.0/24"
BRIDGE="tsreal0"
KUBELET_PORT=10350
NATS_PORT=14777
API_SERVICE_IP="10.96.0.1"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$REPO/tests/image/containers.conf}"
export KUBECONFIG="$WORK/cluster/admin.kubeconfig"
KUBECTL="$BIN_DIR/kubectl"
CTR=(ctr --address "$WORK/containerd/containerd.sock" --namespace k8s.io)

log() { printf '[real_node.sh %s] %s\n' "$(date +%T)" "$*"; }
die() { echo "real_node.sh: $*" >&2; exit 1; }

host_ip() { ip -4 route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p'; }

start() { # name command... (output to $WORK/name.log, pid to $WORK/name.pid)
  local name=$1
  shift
  "$@" >>"$WORK/$name.log" 2>&1 &
  echo $! >"$WORK/$name.pid"
}

wait_for() { # seconds description command...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out waiting for $what"
    sleep 1
  done
}

node_credentials() { # a client certificate for system:node:$NODE, signed by the cluster's CA
  local pki="$WORK/cluster/pki" server
  server=$(sed -n 's/^ *server: //p' "$KUBECONFIG")
  openssl req -new -newkey rsa:2048 -nodes -keyout "$WORK/node.key" \
    -subj "/CN=system:node:$NODE/O=system:nodes" -out "$WORK/node.csr" 2>/dev/null
  openssl x509 -req -in "$WORK/node.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 7 -out "$WORK/node.crt" 2>/dev/null
  cat >"$WORK/node.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: $server, certificate-authority: $pki/ca.crt}}]
users: [{name: node, user: {client-certificate: $WORK/node.crt, client-key: $WORK/node.key}}]
contexts: [{name: node, context: {cluster: local, user: node}}]
current-context: node
EOF
}

start_containerd() {
  mkdir -p "$WORK/cni"
  cat >"$WORK/cni/10-bridge.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "tideshift-real", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
EOF
  cat >"$WORK/containerd.toml" <<EOF
version = 2
root = "$WORK/containerd/root"
state = "$WORK/containerd/state"
[grpc]
  address = "$WORK/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$WORK/cni"
EOF
  start containerd containerd --config "$WORK/containerd.toml"
  wait_for 30 containerd "${CTR[@]}" version
}

load_images() { # podman's images into containerd's k8s.io namespace
  printf 'FROM localhost/tideshift-base:bookworm\nENTRYPOINT ["sleep", "infinity"]\n' \
    >"$WORK/Containerfile.pause"
  podman build --quiet -t "$PAUSE_IMAGE" -f "$WORK/Containerfile.pause" "$WORK" >/dev/null
  local image
  for image in "$PAUSE_IMAGE" "$IMAGE" "$PREDICTOR_IMAGE"; do
    podman save --quiet --format oci-archive -o "$WORK/image.tar" "$image"
    "${CTR[@]}" images import "$WORK/image.tar" >/dev/null
  done
  rm -f "$WORK/image.tar"
}

start_kubelet() {
  mkdir -p "$WORK/kubelet"
  cat >"$WORK/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$WORK/containerd/containerd.sock
failSwapOn: false
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $WORK/cluster/pki/ca.crt}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  start kubelet "$BIN_DIR/kubelet" --config="$WORK/kubelet.yaml" \
    --kubeconfig="$WORK/node.kubeconfig" --hostname-override="$NODE" --node-ip="$(host_ip)" \
    --root-dir="$WORK/kubelet"
  wait_for 60 "node $NODE Ready" "$KUBECTL" wait --for=condition=Ready "node/$NODE" --timeout=1s
}

route_api() { # pods -> 10.96.0.1:443 -> the apiserver on loopback
  local port
  port=$(sed -n 's/^ *server: https:\/\/127.0.0.1://p' "$KUBECONFIG")
  iptables -t nat -A PREROUTING -s "$POD_SUBNET" -d "$API_SERVICE_IP" -p tcp --dport 443 \
    -j DNAT --to-destination "127.0.0.1:$port"
  echo "$port" >"$WORK/api-dnat.port"
  # The CNI plugin creates the bridge with the first pod; made now, it reuses it.
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1"
}

install_chart() {
  cat >"$WORK/values.yaml" <<EOF
image: {repository: ${IMAGE%:*}, tag: ${IMAGE##*:}, pullPolicy: Never}
nats: {bundled: {enabled: false}, url: "nats://$(host_ip):$NATS_PORT"}
predictor:
  image: {repository: ${PREDICTOR_IMAGE%:*}, tag: ${PREDICTOR_IMAGE##*:}}
  config:
    metric_source: sim
    sim_peak_rps: 150
    sim_trough_rps: 150
    workloads: [{namespace: default, name: web}]
planner: {config: {tick_seconds: 1}}
EOF
  "$BIN_DIR/helm" install tideshift "$REPO/charts/tideshift" -f "$WORK/values.yaml" --wait \
    --timeout 5m
  "$KUBECTL" get pods -o wide
}

replicas_are() { [[ "$("$KUBECTL" get deployment web -o jsonpath='{.spec.replicas}')" == "$1" ]]; }

scale_demo() { # a labelled Deployment of 5 real pods; 150 rps at 100 a replica needs 2
  "$KUBECTL" apply -f - <<EOF
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
      terminationGracePeriodSeconds: 1 # sleep, its only process, ignores SIGTERM
      containers: [{name: web, image: "$PAUSE_IMAGE", imagePullPolicy: Never}]
EOF
  wait_for 120 "web scaled to 2 by the executor's pod" replicas_are 2
  "$KUBECTL" get events --field-selector involvedObject.name=web,reason=TideshiftScaled
}

up() {
  [[ $(id -u) == 0 ]] || die "needs root (containerd, kubelet, iptables)"
  [[ -f "$WORK/kubelet.pid" ]] && die "already up: 'bash $0 down' first"
  command -v containerd >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends containerd >/dev/null
  mkdir -p "$WORK"
  TIDESHIFT_BUILD_KUBELET=1 bash "$REPO/tests/cluster/build.sh"
  log "control plane (no kwok nodes)"
  "$REPO/.venv/bin/tideshift" dev cluster up --state-dir "$WORK/cluster" --nodes 0 \
    --gpu-nodes 0 --no-crds --no-storage >/dev/null
  node_credentials
  log "containerd $(containerd --version | awk '{print $3}') and the images"
  start_containerd
  load_images
  log "kubelet, node $NODE"
  start_kubelet
  route_api
  # A fresh JetStream store: a previous run's cluster state would be bootstrapped as current.
  rm -rf "$WORK/nats" && mkdir -p "$WORK/nats"
  start nats "$REPO/.venv/bin/nats-server" -a "$(host_ip)" -p "$NATS_PORT" -js -sd "$WORK/nats"
  log "helm install: the chart's services as pods on $NODE"
  install_chart
  scale_demo
  log "up: KUBECONFIG=$KUBECONFIG; 'bash $0 down' stops it"
}

down() {
  local name
  # The kubelet removes the pods' sandboxes, so no container (nor its shim) outlives containerd.
  "$BIN_DIR/helm" uninstall tideshift >/dev/null 2>&1 || true
  "$KUBECTL" delete deployment web --ignore-not-found >/dev/null 2>&1 || true
  "$KUBECTL" wait --for=delete pod --all --timeout=120s >/dev/null 2>&1 || true
  for name in kubelet nats containerd; do
    [[ -f "$WORK/$name.pid" ]] || continue
    kill "$(cat "$WORK/$name.pid")" 2>/dev/null || true
    rm -f "$WORK/$name.pid"
  done
  if [[ -f "$WORK/api-dnat.port" ]]; then
    iptables -t nat -D PREROUTING -s "$POD_SUBNET" -d "$API_SERVICE_IP" -p tcp --dport 443 \
      -j DNAT --to-destination "127.0.0.1:$(cat "$WORK/api-dnat.port")" || true
    rm -f "$WORK/api-dnat.port"
  fi
  "$REPO/.venv/bin/tideshift" dev cluster down --state-dir "$WORK/cluster" >/dev/null || true
  # The kubelet bind-mounts its root directory onto itself.
  if mountpoint -q "$WORK/kubelet"; then umount "$WORK/kubelet"; fi
  ip link delete "$BRIDGE" 2>/dev/null || true
  rm -rf /var/lib/cni/networks/tideshift-real
  log "down"
}

case "${1:-}" in
up) up ;;
down) down ;;
*) echo "usage: bash tests/cluster/real_node.sh up|down" >&2; exit 2 ;;
esac
