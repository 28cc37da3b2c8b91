#!/usr/bin/env bash
# A real multi-node Kubernetes cluster inside network namespaces this script creates: nothing on
# the host's network (links, addresses, routes, iptables/nftables rules) is touched.
#
#   bash tests/cluster/real/cluster.sh up [--nodes N]   # N real nodes (default 2, 1..9)
#   bash tests/cluster/real/cluster.sh down             # every process, namespace, mount, file
#   bash tests/cluster/real/cluster.sh status
#   export KUBECONFIG=$(bash tests/cluster/real/cluster.sh kubeconfig)
#
# Layout (the prefix tsr is TIDESHIFT_REAL_PREFIX):
#   netns tsr-cp   bridge tsbr0 10.250.0.1/24; etcd, kube-apiserver (6443), controller-manager,
#                  scheduler; routes to every node's pod subnet
#   netns tsr-nI   eth0 10.250.0.(10+I)/24, a veth whose peer is on tsr-cp's bridge; containerd,
#                  kubelet and kube-proxy (iptables mode) in a private mount namespace that
#                  hides /run, /var/lib, /var/log and the kernel tunables the kubelet would set,
#                  so their mounts, sockets, pod netns and logs vanish with their processes;
#                  pods on 10.244.I.0/24 through the CNI ptp plugin (routed, no bridge netfilter)
#   services 10.96.0.0/16: kubernetes 10.96.0.1, CoreDNS (a Deployment) 10.96.0.10
#   the host   only a loopback listener, 127.0.0.1:<port>, forwarding to the apiserver inside
#              tsr-cp (apiforward.py; its socket was bound before it entered tsr-cp)
#
# Needs root, build.sh's binaries (build.sh runs here when something is missing) and the
# images of `make image`. Debian packages are installed when missing. Kept between runs (caches,
# not state): the Go-built binaries and the images' archives ($TIDESHIFT_CACHE_DIR/
# real-cluster-images, keyed by image id). Everything else lives in the state dir, which down
# removes, with the cgroups it made under the hierarchy roots (/sys/fs/cgroup/*/tsr-nI).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
HERE="$REPO/tests/cluster/real"
CACHE_ROOT="${TIDESHIFT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tideshift}"
PFX="${TIDESHIFT_REAL_PREFIX:-tsr}"
STATE="${TIDESHIFT_REAL_STATE_DIR:-$CACHE_ROOT/real-cluster-$PFX}"
IMAGE_CACHE="$CACHE_ROOT/real-cluster-images"
read -r BIN_DIR REAL_BIN_DIR < <(bash "$HERE/build.sh" --print-dirs)
IMAGES="${TIDESHIFT_REAL_IMAGES:-localhost/tideshift:dev localhost/tideshift-predictor:dev}"
PAUSE_IMAGE="localhost/tideshift-real-pause:1"
COREDNS_IMAGE="localhost/tideshift-real-coredns:v1.15.0"
# The chart's bundled NATS from the nats-server binary the venv installs (a static Go binary).
NATS_SERVER="$REPO/.venv/bin/nats-server"
NATS_IMAGE="localhost/tideshift-real-nats:$("$NATS_SERVER" --version 2>/dev/null | sed -n 's/^nats-server: v//p')"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$REPO/tests/image/containers.conf}"

CP_NS="$PFX-cp"
NET="10.250.0"
CP_IP="$NET.1"
POD_CIDR="10.244.0.0/16"
SERVICE_CIDR="10.96.0.0/16"
API_VIP="10.96.0.1"
DNS_VIP="10.96.0.10"
DEBS=(containerd runc containernetworking-plugins iptables podman)
# What the kubelet writes at start-up (setupKernelTunables): host-wide, so each node's mount
# namespace covers them with files of its own.
TUNABLES=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
  kernel/keys/root_maxkeys kernel/keys/root_maxbytes)

STARTED=$SECONDS
log() { printf '[real/cluster.sh %4ds] %s\n' "$((SECONDS - STARTED))" "$*"; }
die() { echo "real/cluster.sh: $*" >&2; exit 1; }
# Its discovery cache in the state dir, not ~/.kube/cache.
kubectl() { "$BIN_DIR/kubectl" --kubeconfig "$STATE/kubeconfig" --cache-dir "$STATE/kube-cache" "$@"; }

node_ns() { echo "$PFX-n$1"; }
node_ip() { echo "$NET.$((10 + $1))"; }
node_name() { echo "$PFX-node-$1"; }
node_dir() { echo "$STATE/node-$1"; }

wait_for() { # seconds description command...
  local seconds=$1 what=$2
  local deadline=$((SECONDS + seconds))
  shift 2
  # A subshell: a trap (INT/TERM during up) then runs with the script's own stdout/stderr,
  # not the probe's /dev/null.
  until ("$@") >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after $seconds s waiting for $what"
    sleep 0.5
  done
}

# ---- prerequisites --------------------------------------------------------------------------

install_debs() {
  local missing=() pkg
  for pkg in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
}

# An image FROM scratch holding one static binary, /usr/local/bin/<name> on PATH, as its
# entrypoint (the sandbox's pause, CoreDNS, NATS for the chart's bundled server).
scratch_image() { # image binary
  local image=$1 binary=$2 dir name stamp
  name=$(basename "$binary")
  stamp="$(sha256sum "$binary" | cut -c1-16)-2" # -2: the binary under /usr/local/bin
  [[ "$(podman image inspect --format '{{index .Labels "tideshift.binary"}}' "$image" 2>/dev/null)" == "$stamp" ]] &&
    return
  dir=$(mktemp -d)
  cp "$binary" "$dir/$name"
  printf 'FROM scratch\nCOPY %s /usr/local/bin/%s\nENV PATH=/usr/local/bin\nLABEL tideshift.binary=%s\nENTRYPOINT ["/usr/local/bin/%s"]\n' \
    "$name" "$name" "$stamp" "$name" >"$dir/Containerfile"
  podman build --quiet -t "$image" -f "$dir/Containerfile" "$dir" >/dev/null
  rm -rf "$dir"
}

image_archive() { # image -> path of a docker-archive of it, cached by image id
  local id file
  id=$(podman image inspect --format '{{.Id}}' "$1") || die "image $1 missing: run 'make image'"
  file="$IMAGE_CACHE/${id:0:24}.tar"
  if [[ ! -f "$file" ]]; then
    mkdir -p "$IMAGE_CACHE"
    podman save --quiet --format docker-archive -o "$file.tmp" "$1"
    mv "$file.tmp" "$file"
  fi
  echo "$file"
}

# ---- certificates -----------------------------------------------------------------------------

cert() { # name subject [subjectAltName]
  local pki="$STATE/pki"
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$pki/$1.key" -subj "$2" -out "$pki/$1.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [[ -n "${3:-}" ]] && echo "subjectAltName=$3"
  } >"$pki/$1.ext"
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 7 -extfile "$pki/$1.ext" -out "$pki/$1.crt" 2>/dev/null
  rm -f "$pki/$1.csr" "$pki/$1.ext"
}

kubeconfig() { # file server cert-name
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: real, cluster: {server: "$2", certificate-authority: "$STATE/pki/ca.crt"}}]
users: [{name: $3, user: {client-certificate: "$STATE/pki/$3.crt", client-key: "$STATE/pki/$3.key"}}]
contexts: [{name: real, context: {cluster: real, user: $3}}]
current-context: real
EOF
}

make_pki() {
  local pki="$STATE/pki" i
  mkdir -p "$pki"
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" -subj "/CN=tideshift-real-ca" -days 7 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" "IP:$CP_IP,IP:$API_VIP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert admin "/O=system:masters/CN=tideshift-real-admin"
  cert apiserver-kubelet "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert controller-manager "/CN=system:kube-controller-manager"
  cert scheduler "/CN=system:kube-scheduler"
  cert kube-proxy "/CN=system:kube-proxy"
  for ((i = 0; i < NODES; i++)); do
    cert "node-$i" "/O=system:nodes/CN=system:node:$(node_name "$i")"
  done
  local inside="https://$CP_IP:6443"
  kubeconfig "$STATE/controller-manager.kubeconfig" "https://127.0.0.1:6443" controller-manager
  kubeconfig "$STATE/scheduler.kubeconfig" "https://127.0.0.1:6443" scheduler
  kubeconfig "$STATE/admin-inside.kubeconfig" "$inside" admin
  kubeconfig "$STATE/kube-proxy.kubeconfig" "$inside" kube-proxy
  for ((i = 0; i < NODES; i++)); do
    kubeconfig "$STATE/node-$i.kubeconfig" "$inside" "node-$i"
  done
}

# ---- network ------------------------------------------------------------------------------------

in_ns() { nsenter --net="/run/netns/$1" -- "${@:2}"; }

make_network() {
  local i j ns
  ip netns add "$CP_NS"
  echo "$CP_NS" >>"$STATE/netns"
  ip -n "$CP_NS" link set lo up
  ip -n "$CP_NS" link add tsbr0 type bridge
  ip -n "$CP_NS" addr add "$CP_IP/24" dev tsbr0
  ip -n "$CP_NS" link set tsbr0 up
  in_ns "$CP_NS" sysctl -qw net.ipv4.ip_forward=1
  for ((i = 0; i < NODES; i++)); do
    ns=$(node_ns "$i")
    ip netns add "$ns"
    echo "$ns" >>"$STATE/netns"
    ip -n "$ns" link set lo up
    # Created inside the node's namespace with its peer moved straight into tsr-cp: the
    # pair never exists on the host.
    ip -n "$ns" link add eth0 type veth peer name "veth$i" netns "$CP_NS"
    ip -n "$CP_NS" link set "veth$i" master tsbr0 up
    ip -n "$ns" addr add "$(node_ip "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "$CP_IP"
    in_ns "$ns" sysctl -qw net.ipv4.ip_forward=1
    ip -n "$CP_NS" route add "10.244.$i.0/24" via "$(node_ip "$i")"
  done
  for ((i = 0; i < NODES; i++)); do
    for ((j = 0; j < NODES; j++)); do
      ((i == j)) || ip -n "$(node_ns "$i")" route add "10.244.$j.0/24" via "$(node_ip "$j")"
    done
  done
}

# ---- processes --------------------------------------------------------------------------------

launch() { # name command... (detached; its log in $STATE/logs, its pid in $STATE/pids)
  local name=$1
  shift
  setsid "$@" >>"$STATE/logs/$name.log" 2>&1 </dev/null &
  echo "$name $!" >>"$STATE/pids"
  eval "PID_${name//-/_}=$!"
}

start_control_plane() {
  local pki="$STATE/pki"
  mkdir -p "$STATE/etcd"
  launch etcd nsenter --net="/run/netns/$CP_NS" -- "$BIN_DIR/etcd" --name real \
    --data-dir "$STATE/etcd" --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster real=http://127.0.0.1:2380 --unsafe-no-fsync --log-level warn
  launch kube-apiserver nsenter --net="/run/netns/$CP_NS" -- "$BIN_DIR/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 --bind-address=0.0.0.0 --secure-port=6443 \
    --advertise-address="$CP_IP" --service-cluster-ip-range="$SERVICE_CIDR" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" --kubelet-client-certificate="$pki/apiserver-kubelet.crt" \
    --kubelet-client-key="$pki/apiserver-kubelet.key" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true --profiling=false --cert-dir="$STATE/apiserver"
  launch apiforward python3 "$HERE/apiforward.py" \
    --netns "/run/netns/$CP_NS" --target "$CP_IP:6443" --port-file "$STATE/api.port"
  wait_for 20 "the loopback forwarder" test -s "$STATE/api.port"
  kubeconfig "$STATE/kubeconfig" "https://127.0.0.1:$(cat "$STATE/api.port")" admin
  wait_for 90 "kube-apiserver /readyz" kubectl get --raw /readyz
  launch kube-controller-manager nsenter --net="/run/netns/$CP_NS" -- \
    "$BIN_DIR/kube-controller-manager" --kubeconfig="$STATE/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
    --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --cluster-cidr="$POD_CIDR" --service-cluster-ip-range="$SERVICE_CIDR" \
    --node-monitor-period=2s --node-monitor-grace-period=20s \
    --cert-dir="$STATE/controller-manager"
  launch kube-scheduler nsenter --net="/run/netns/$CP_NS" -- "$BIN_DIR/kube-scheduler" \
    --kubeconfig="$STATE/scheduler.kubeconfig" \
    --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
    --authorization-kubeconfig="$STATE/scheduler.kubeconfig" --leader-elect=false
}

node_files() { # index
  local i=$1 dir name
  dir=$(node_dir "$i")
  name=$(node_name "$i")
  mkdir -p "$dir/cni" "$dir/ipam" "$dir/tunables" "$dir/containerd" "$dir/kubelet"
  cat >"$dir/cni/10-real.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "$PFX-pods", "plugins": [
  {"type": "ptp", "ipMasq": false, "mtu": 1500,
   "ipam": {"type": "host-local", "dataDir": "$dir/ipam",
            "ranges": [[{"subnet": "10.244.$i.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  cat >"$dir/containerd.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "/run/containerd"
[grpc]
  address = "$dir/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "${TIDESHIFT_REAL_SNAPSHOTTER:-overlayfs}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni"
EOF
  printf '# the real test cluster has no upstream DNS\noptions ndots:5\n' >"$dir/resolv.conf"
  cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$PFX-n$i
containerRuntimeEndpoint: unix://$dir/containerd.sock
failSwapOn: false
address: $(node_ip "$i")
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: AlwaysAllow}
clusterDNS: [$DNS_VIP]
clusterDomain: cluster.local
resolvConf: $dir/resolv.conf
serializeImagePulls: false
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# A lost node is seen in ~20 s, not 40-50 s: its lease renewed every 3 s (a quarter of 12 s),
# the controller-manager's grace period 20 s (see start_control_plane).
nodeLeaseDurationSeconds: 12
nodeStatusUpdateFrequency: 4s
EOF
  cat >"$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
hostnameOverride: $name
bindAddress: 0.0.0.0
clusterCIDR: $POD_CIDR
mode: iptables
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [primary]
EOF
  # The mount namespace's set-up, then containerd (exec'd: its pid is the namespace's anchor).
  {
    echo "set -e"
    echo "mount -t tmpfs -o mode=755 tsr-run /run"
    echo "mount -t tmpfs -o mode=755 tsr-varlib /var/lib"
    echo "mount -t tmpfs -o mode=755 tsr-varlog /var/log"
    local t
    for t in "${TUNABLES[@]}"; do
      cat "/proc/sys/$t" >"$dir/tunables/${t//\//.}"
      echo "mount --bind '$dir/tunables/${t//\//.}' /proc/sys/$t"
    done
    # Unpacked images on a tmpfs of the node's own: gone with it at down, instead of tens of
    # thousands of files to delete (TIDESHIFT_REAL_SNAPSHOTS_ON_DISK=1 keeps them on disk).
    if [[ -z "${TIDESHIFT_REAL_SNAPSHOTS_ON_DISK:-}" ]]; then
      local snapshots="$dir/containerd/root/io.containerd.snapshotter.v1.${TIDESHIFT_REAL_SNAPSHOTTER:-overlayfs}"
      mkdir -p "$snapshots"
      echo "mount -t tmpfs -o mode=700 tsr-snapshots '$snapshots'"
    fi
    echo "exec containerd --config '$dir/containerd.toml'"
  } >"$dir/mounts.sh"
  local c
  for c in /sys/fs/cgroup/*/; do
    [[ -f "$c/cgroup.procs" ]] || continue
    mkdir -p "$c$PFX-n$i"
    if [[ -f "$c/cpuset.cpus" ]]; then
      cat "$c/cpuset.cpus" >"$c$PFX-n$i/cpuset.cpus"
      cat "$c/cpuset.mems" >"$c$PFX-n$i/cpuset.mems"
    fi
  done
}

ctr_node() { ctr --address "$(node_dir "$1")/containerd.sock" --namespace k8s.io "${@:2}"; }

start_node() { # index
  local i=$1 ns dir pid
  ns=$(node_ns "$i")
  dir=$(node_dir "$i")
  launch "containerd-$i" nsenter --net="/run/netns/$ns" -- \
    unshare --mount -- bash "$dir/mounts.sh"
  wait_for 30 "containerd of node $i" ctr_node "$i" version
}

# The images' content, imported once into a containerd root kept in the cache (keyed by the
# archives); each node's containerd root starts as hard links to its blobs and a copy of its
# metadata. Blobs are immutable (containerd writes new content elsewhere and renames it), so the
# links are safe; the CRI unpacks an image the first time a container of it is created on the
# node, so each node unpacks (and down deletes) only what it ran.
content_template() { # archives... -> the template root
  local key dir tmp pid archive
  key=$(printf '%s\n' "$@" | xargs -n1 basename | sha256sum | cut -c1-16)
  dir="$IMAGE_CACHE/containerd-$key"
  if [[ ! -d "$dir" ]]; then
    rm -rf "$IMAGE_CACHE"/containerd-* "$IMAGE_CACHE"/.partial.* # the images changed
    tmp=$(mktemp -d "$IMAGE_CACHE/.partial.XXXXXX")
    cat >"$tmp/config.toml" <<EOF
version = 2
root = "$tmp/root"
state = "$tmp/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$tmp/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$tmp/opt"
EOF
    # An empty network namespace and a mount namespace of its own: nothing reaches the host.
    unshare --net --mount -- containerd --config "$tmp/config.toml" >"$tmp/containerd.log" 2>&1 &
    pid=$!
    wait_for 30 "the template's containerd" ctr --address "$tmp/containerd.sock" version
    for archive in "$@"; do
      ctr --address "$tmp/containerd.sock" --namespace k8s.io images import --no-unpack \
        "$archive" >/dev/null || { kill "$pid"; die "ctr images import $archive failed"; }
    done
    kill "$pid"
    wait "$pid" || true
    mkdir -p "$tmp/template"
    mv "$tmp/root/io.containerd.content.v1.content" "$tmp/template/"
    mv "$tmp/root/io.containerd.metadata.v1.bolt" "$tmp/template/"
    mv "$tmp/template" "$dir"
    rm -rf "$tmp"
  fi
  echo "$dir"
}

seed_node_root() { # index template
  local root
  root="$(node_dir "$1")/containerd/root"
  mkdir -p "$root/io.containerd.metadata.v1.bolt"
  cp -al "$2/io.containerd.content.v1.content" "$root/"
  cp "$2/io.containerd.metadata.v1.bolt/meta.db" "$root/io.containerd.metadata.v1.bolt/"
}

start_node_agents() { # index
  local i=$1 dir pid
  dir=$(node_dir "$i")
  eval "pid=\$PID_containerd_$i"
  launch "kubelet-$i" nsenter --target "$pid" --net --mount -- "$BIN_DIR/kubelet" \
    --config="$dir/kubelet.yaml" --kubeconfig="$STATE/node-$i.kubeconfig" \
    --hostname-override="$(node_name "$i")" --node-ip="$(node_ip "$i")" \
    --root-dir="$dir/kubelet"
  launch "kube-proxy-$i" nsenter --target "$pid" --net --mount -- "$BIN_DIR/kube-proxy" \
    --config="$dir/kube-proxy.yaml"
}

nodes_registered() { [[ $(kubectl get nodes --no-headers 2>/dev/null | wc -l) -ge $NODES ]]; }

coredns() {
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: tideshift-real:coredns}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: tideshift-real:coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: tideshift-real:coredns}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      priorityClassName: system-cluster-critical
      containers:
      - name: coredns
        image: $COREDNS_IMAGE
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {containerPort: 53, name: dns, protocol: UDP}
        - {containerPort: 53, name: dns-tcp, protocol: TCP}
        # Generous timeouts: on a 2-core machine shared with other suites (load average 40
        # seen) a 1 s probe timeout restarted CoreDNS, and every lookup failed meanwhile.
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2, timeoutSeconds: 5}
        livenessProbe: {httpGet: {path: /health, port: 8080}, periodSeconds: 10, timeoutSeconds: 10,
                        failureThreshold: 6}
        securityContext:
          capabilities: {add: [NET_BIND_SERVICE]}
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_VIP
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
EOF
}

# ---- up / down ----------------------------------------------------------------------------------

up() {
  [[ $(id -u) == 0 ]] || die "needs root (network namespaces, containerd, kubelet)"
  [[ -e "$STATE" ]] && die "$STATE exists: already up? 'bash $0 down' first"
  install_debs
  bash "$HERE/build.sh" || die "tests/cluster/real/build.sh failed"
  local image archives=() i t0=$SECONDS
  scratch_image "$PAUSE_IMAGE" "$REAL_BIN_DIR/pause"
  scratch_image "$COREDNS_IMAGE" "$REAL_BIN_DIR/coredns"
  [[ -x "$NATS_SERVER" ]] || die "$NATS_SERVER missing: make install"
  scratch_image "$NATS_IMAGE" "$NATS_SERVER"
  for image in "$PAUSE_IMAGE" "$COREDNS_IMAGE" "$NATS_IMAGE" $IMAGES; do
    archives+=("$(image_archive "$image")")
  done
  log "binaries and image archives ready ($((SECONDS - t0)) s)"
  mkdir -p "$STATE/logs"
  trap 'status=$?; if ((status)); then failed; fi' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  make_pki
  make_network
  log "network namespaces $CP_NS and $(node_ns 0)..$(node_ns $((NODES - 1)))"
  start_control_plane
  log "control plane ready; kubeconfig $STATE/kubeconfig"
  local template
  template=$(content_template "${archives[@]}")
  for ((i = 0; i < NODES; i++)); do
    node_files "$i"
    seed_node_root "$i" "$template"
    start_node "$i"
  done
  log "$NODES containerd(s) with the images"
  for ((i = 0; i < NODES; i++)); do start_node_agents "$i"; done
  wait_for 90 "$NODES nodes registered" nodes_registered
  kubectl wait --for=condition=Ready nodes --all --timeout=120s >/dev/null
  log "$NODES nodes Ready"
  coredns
  kubectl -n kube-system rollout status deployment/coredns --timeout=120s >/dev/null
  echo "$NODES" >"$STATE/nodes"
  trap - EXIT INT TERM
  log "up: export KUBECONFIG=$STATE/kubeconfig"
}

failed() {
  echo "real/cluster.sh: up failed; last lines of each log:" >&2
  local f
  for f in "$STATE"/logs/*.log; do
    [[ -f "$f" ]] || continue
    echo "--- $f" >&2
    tail -n 15 "$f" >&2
  done
  if [[ -z "${TIDESHIFT_REAL_KEEP:-}" ]]; then down; else echo "kept (TIDESHIFT_REAL_KEEP)" >&2; fi
}

our_netns() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PFX-(cp|n[0-9]+)$" || true; }
our_cgroups() { compgen -G "/sys/fs/cgroup/*/$PFX-n[0-9]*" || true; }

# Every process still inside one of our network namespaces (daemons, shims, the forwarder)...
netns_processes() {
  local inodes=() ns pid link
  for ns in $(our_netns); do inodes+=("net:[$(stat -L -c %i "/run/netns/$ns")]"); done
  ((${#inodes[@]})) || return 0
  for pid in /proc/[0-9]*; do
    link=$(readlink "$pid/ns/net" 2>/dev/null) || continue
    [[ " ${inodes[*]} " == *" $link "* ]] && echo "${pid#/proc/}"
  done
  return 0
}
# ... or in one of our cgroups (the containers, in their pods' namespaces).
cgroup_processes() {
  local cg
  for cg in $(our_cgroups); do find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null; done
  return 0
}

down() {
  local name deadline pids
  # Only processes found in our namespaces or cgroups are signalled (a pid recorded by an
  # earlier run may belong to someone else by now).
  # shellcheck disable=SC2046
  kill -TERM $(netns_processes) 2>/dev/null || true
  # Containers are killed outright (nothing in them needs a graceful stop when the whole
  # cluster goes); the daemons get 3 s after TERM.
  deadline=$((SECONDS + 3))
  while pids=$({ cgroup_processes; netns_processes; } | sort -u) && [[ -n "$pids" ]]; do
    # shellcheck disable=SC2046,SC2086
    kill -KILL $(cgroup_processes) 2>/dev/null || true
    # shellcheck disable=SC2086
    if ((SECONDS >= deadline)); then
      log "still running 3 s after TERM, killed: $(ps -o comm= -p "${pids//$'\n'/,}" | sort | uniq -c | xargs)"
      kill -KILL $pids 2>/dev/null || true
    fi
    ((SECONDS < deadline + 20)) || die "processes left in our namespaces/cgroups: $pids"
    sleep 0.2
  done
  log "processes stopped"
  local cg
  for cg in $(our_cgroups); do
    find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [[ ! -d "$cg" ]] || die "could not remove cgroup $cg"
  done
  for name in $(our_netns); do ip netns delete "$name"; done
  log "cgroups and network namespaces removed"
  # Mounts only ever lived in the nodes' private mount namespaces, gone with their processes.
  if [[ -d "$STATE" ]] && findmnt -rn -o TARGET | grep -q "^$STATE"; then
    die "mounts left under $STATE: $(findmnt -rn -o TARGET | grep "^$STATE" | tr '\n' ' ')"
  fi
  rm -rf "$STATE"
  log "down: no process, namespace, cgroup or file of the real cluster is left"
}

# A node's kubelet stopped and its pods lost (the fault tests/real/test_real_day.py injects):
# the kubelet is killed, every container of the node (its cgroup) too; containerd and
# kube-proxy stay. node-start launches the kubelet again, as up did.
node_processes() { # index comm -> pids of that command in the node's network namespace
  local inode pid link
  inode="net:[$(stat -L -c %i "/run/netns/$(node_ns "$1")")]"
  for pid in /proc/[0-9]*; do
    link=$(readlink "$pid/ns/net" 2>/dev/null) || continue
    [[ "$link" == "$inode" && "$(cat "$pid/comm" 2>/dev/null)" == "$2" ]] && echo "${pid#/proc/}"
  done
  return 0
}

node_stop() { # index
  local i=$1 pids deadline
  [[ -f "$STATE/nodes" ]] || die "not up"
  pids=$(node_processes "$i" kubelet)
  [[ -n "$pids" ]] || die "node $i has no kubelet running"
  # shellcheck disable=SC2086
  kill -KILL $pids
  deadline=$((SECONDS + 20))
  while pids=$(find /sys/fs/cgroup/*/"$PFX-n$i" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u) &&
    [[ -n "$pids" ]]; do
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    ((SECONDS < deadline)) || die "node $i: containers still running: $pids"
    sleep 0.2
  done
  log "node $i: kubelet and every container killed"
}

node_start() { # index
  local i=$1 pid
  [[ -f "$STATE/nodes" ]] || die "not up"
  [[ -z "$(node_processes "$i" kubelet)" ]] || die "node $i: its kubelet is running"
  pid=$(node_processes "$i" containerd | head -n1)
  [[ -n "$pid" ]] || die "node $i has no containerd"
  local dir
  dir=$(node_dir "$i")
  launch "kubelet-$i" nsenter --target "$pid" --net --mount -- "$BIN_DIR/kubelet" \
    --config="$dir/kubelet.yaml" --kubeconfig="$STATE/node-$i.kubeconfig" \
    --hostname-override="$(node_name "$i")" --node-ip="$(node_ip "$i")" \
    --root-dir="$dir/kubelet"
  log "node $i: kubelet started again"
}

status() {
  [[ -f "$STATE/nodes" ]] || { echo "down"; return 1; }
  kubectl get nodes -o wide
  kubectl get pods -A -o wide
}

NODES=2
NODE=""
cmd="${1:-}"
shift || true
while (($#)); do
  case "$1" in
  --nodes) NODES="$2"; shift 2 ;;
  --node) NODE="$2"; shift 2 ;;
  *) die "unknown option $1" ;;
  esac
done
[[ "$NODES" =~ ^[1-9]$ ]] || die "--nodes must be 1..9"
case "$cmd" in
up) up ;;
down) down ;;
status) status ;;
kubeconfig) echo "$STATE/kubeconfig" ;;
nats-image) echo "$NATS_IMAGE" ;;
node-stop | node-start)
  [[ "$NODE" =~ ^[0-8]$ ]] || die "$cmd needs --node I (0..8)"
  "${cmd/-/_}" "$NODE" ;;
*) echo "usage: bash tests/cluster/real/cluster.sh up [--nodes N] | down | status | kubeconfig | nats-image | node-stop --node I | node-start --node I" >&2; exit 2 ;;
esac
