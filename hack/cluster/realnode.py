"""One real node beside the KWOK nodes: containerd and runc run its pods for real.

What runs on the host, started by `cluster.py up` after the controllers (hack/cluster/cluster.py):

- containerd 2.x (built from its Go module) with Debian's runc, and the CNI bridge plugin from
  Debian's containernetworking-plugins: pods get addresses in POD_CIDR on the bridge BRIDGE, whose
  address GATEWAY is the host as the pods see it.
- a kubelet (k8s.io/kubernetes, the same version as the control plane) registering REAL_NODE,
  tainted and labelled so that only pods that ask for it land there (the KWOK tests never do).
- kube-proxy (iptables mode), so the pods reach the API server at the `kubernetes` Service's
  ClusterIP, as every in-cluster client does; the API server's own endpoint is written here,
  because the control plane runs with `--endpoint-reconciler-type=none`.
- CoreDNS on GATEWAY:53 for cluster DNS: Trainer's MPI hostfile names the workers by their
  JobSet hostnames (`<job>-node-0-1.<job>`), which only cluster DNS resolves.
- kube-router with only its NetworkPolicy controller, so NetworkPolicies are enforced (iptables +
  ipset on the bridge, with br_netfilter), the NetworkPolicy this service injects among them.

The images the pods run (the OpenMPI runtime, the service, the pod sandbox) are built by
hack/images/images.py and imported into containerd directly: there is no registry here.
Everything lives under run/realnode and is torn down by `down` (containers, mounts, the bridge,
the iptables rules and ipsets of kube-proxy and kube-router).
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

REAL_NODE = "real-node-0"
POD_CIDR = "10.88.0.0/16"
GATEWAY = "10.88.0.1"  # the bridge's address: kubelet, CoreDNS and the API server as pods reach it
BRIDGE = "tja0"
LABEL = ("trainjob-admission.io/real-node", "true")
TAINT = {"key": "trainjob-admission.io/real-node", "value": "true", "effect": "NoSchedule"}
# What a pod spec needs to run on the real node.
PLACEMENT = {"nodeSelector": {LABEL[0]: LABEL[1]},
             "tolerations": [{"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"],
                              "effect": TAINT["effect"]}]}
HOST_TOOLS = {  # Debian package -> a file it installs that the node needs
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "iptables": "/usr/sbin/iptables",
    "ipset": "/usr/sbin/ipset",
    "conntrack": "/usr/sbin/conntrack",
}
CNI_BIN = "/usr/lib/cni"
RUNC_ROOT = Path("/run/containerd/runc/k8s.io")  # where containerd's runc shim keeps pods' container state


def install_host_tools(log) -> None:
    """apt-get install the Debian packages the node and its images need, when root and missing
    (`make test` on a fresh machine); elsewhere unsupported_reason() says what is missing."""
    missing = [pkg for pkg, path in {**HOST_TOOLS, "mmdebstrap": "/usr/bin/mmdebstrap",
                                     "eatmydata": "/usr/bin/eatmydata"}.items()  # images: dpkg without fsync
               if not os.path.exists(path)]
    if not missing or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    log(f"build: apt-get install {' '.join(missing)} (the real node)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    if subprocess.run(["apt-get", *lock, "install", "-y", "-q", "--no-install-recommends", *missing],
                      env=env, capture_output=True, timeout=1200).returncode != 0:
        subprocess.run(["apt-get", *lock, "update", "-q"], env=env, capture_output=True, timeout=600)
        out = subprocess.run(["apt-get", *lock, "install", "-y", "-q", "--no-install-recommends", *missing],
                             env=env, capture_output=True, text=True, timeout=1200)
        if out.returncode != 0:
            log(f"build: apt-get install failed; the real node will be skipped:\n{out.stderr[-1500:]}")


def unsupported_reason() -> str | None:
    """Why this machine cannot run the real node, or None when it can (checked before `up` starts it)."""
    if os.geteuid() != 0:
        return "not root: containerd, the kubelet and the CNI bridge need root"
    missing = [pkg for pkg, path in {**HOST_TOOLS, "mmdebstrap": "/usr/bin/mmdebstrap"}.items()
               if not os.path.exists(path)]
    if missing:
        return f"Debian packages missing: {' '.join(missing)} (apt-get install {' '.join(missing)})"
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "no memory cgroup mounted"
    probe = subprocess.run(["unshare", "--mount", "--net", "--pid", "--fork", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"cannot create namespaces: {probe.stderr.strip()[:200]}"
    return None


def node_dir(run: Path) -> Path:
    return run / "realnode"


def containerd_socket(run: Path) -> Path:
    return node_dir(run) / "containerd" / "containerd.sock"


# ---------------------------------------------------------------------------------------------
# Configuration files (pure: written by start(), read by the unit tests)
# ---------------------------------------------------------------------------------------------
def containerd_config(run: Path, sandbox_image: str) -> str:
    """containerd 2.x config (version 3): its own root, state and socket under run/, runc with
    cgroupfs (cgroups v1 here), the CNI bridge, and the sandbox image that was imported."""
    d = node_dir(run) / "containerd"
    return "\n".join([
        "version = 3",
        f'root = "{d / "root"}"',
        f'state = "{d / "state"}"',
        "[grpc]",
        f'  address = "{containerd_socket(run)}"',
        "[plugins.'io.containerd.cri.v1.images']",
        "  snapshotter = 'overlayfs'",
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f"  sandbox = '{sandbox_image}'",
        "[plugins.'io.containerd.cri.v1.runtime']",
        # no CAP_SYS_RESOURCE here: the kubelet's negative oom_score_adj for pods would fail runc
        "  restrict_oom_score_adj = true",
        "[plugins.'io.containerd.cri.v1.runtime'.cni]",
        f"  bin_dirs = ['{CNI_BIN}']",
        f"  conf_dir = '{node_dir(run) / 'cni'}'",
        "[plugins.'io.containerd.cri.v1.runtime'.containerd]",
        "  default_runtime_name = 'runc'",
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]",
        "  runtime_type = 'io.containerd.runc.v2'",
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]",
        "  BinaryName = '/usr/sbin/runc'",
        "  SystemdCgroup = false",
        "",
    ])


def cni_config(run: Path) -> dict:
    """A bridge network with host-local addresses and masquerade for traffic leaving POD_CIDR."""
    return {"cniVersion": "1.0.0", "name": "trainjob-admission", "plugins": [
        {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
         "ipam": {"type": "host-local", "dataDir": str(node_dir(run) / "ipam"),
                  "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                  "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ]}


def kubelet_config(run: Path, ports: dict, ca: Path) -> dict:
    d = node_dir(run)
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": GATEWAY, "port": ports["kubelet"], "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": ports["kubelet-healthz"],
        "tlsCertFile": str(d / "pki/kubelet-serving.crt"), "tlsPrivateKeyFile": str(d / "pki/kubelet-serving.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{containerd_socket(run)}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,  # this machine has cgroups v1 (the kubelet refuses them by default)
        "failSwapOn": False,
        "oomScoreAdj": 0,  # lowering it needs CAP_SYS_RESOURCE, which a sandboxed machine may lack
        "clusterDNS": [GATEWAY], "clusterDomain": "cluster.local",
        "resolvConf": str(d / "resolv.conf"),
        "registerWithTaints": [TAINT],
        "maxPods": 40,
        "serializeImagePulls": False,
        # a shared disk: never evict for what other processes on the machine use
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "nodeStatusReportFrequency": "10s", "syncFrequency": "10s",
        "staticPodPath": "",
    }


def kube_proxy_config(run: Path, ports: dict) -> dict:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(node_dir(run) / "kube-proxy.kubeconfig")},
        "hostnameOverride": REAL_NODE, "mode": "iptables", "clusterCIDR": POD_CIDR,
        "detectLocalMode": "ClusterCIDR",
        "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
        "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy-healthz']}",
        "conntrack": {"maxPerCore": 0, "min": 0},  # 0: leave the machine's conntrack table alone
    }


def corefile(run: Path, ports: dict) -> str:
    kc = node_dir(run) / "coredns.kubeconfig"
    return "\n".join([
        ".:53 {",
        f"    bind {GATEWAY}",
        "    errors",
        f"    health 127.0.0.1:{ports['coredns-health']}",
        f"    ready 127.0.0.1:{ports['coredns-ready']}",
        "    kubernetes cluster.local in-addr.arpa ip6.arpa {",
        f"        kubeconfig {kc} system:coredns@trainjob-admission",
        "        pods insecure",
        "        fallthrough in-addr.arpa ip6.arpa",
        "    }",
        "    cache 5",
        "}",
        "",
    ])


def rbac_objects() -> list:
    """What the node's host processes may do beyond the built-in roles (kubelet: system:node via the
    Node authorizer; kube-proxy: system:node-proxier): CoreDNS and kube-router read only."""
    def reader(name: str, rules: list) -> list:
        return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                 "metadata": {"name": f"tja-test:{name}"}, "rules": rules},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": f"tja-test:{name}"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": f"tja-test:{name}"},
                 "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": f"system:{name}"}]}]
    watch = ["get", "list", "watch"]
    return [
        *reader("coredns", [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                             "verbs": ["list", "watch"]},
                            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                             "verbs": ["list", "watch"]}]),
        *reader("kube-router", [{"apiGroups": [""], "resources": ["pods", "namespaces", "nodes", "services",
                                                                  "endpoints"], "verbs": watch},
                                {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                                 "verbs": watch},
                                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                                 "verbs": watch},
                                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]),
        # kube-proxy is bound to system:node-proxier, which exists in every cluster
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "tja-test:kube-proxy"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-proxier"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-proxy"}]},
    ]


def apiserver_endpoint(port: int) -> dict:
    """The `kubernetes` Service's EndpointSlice: the API server as pods reach it (the control plane
    runs with --endpoint-reconciler-type=none, which leaves this to whoever knows the address)."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "kubernetes",
                                    "endpointslice.kubernetes.io/managed-by": "trainjob-admission.io-test-cluster"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [GATEWAY], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}


# ---------------------------------------------------------------------------------------------
# Host networking
# ---------------------------------------------------------------------------------------------
def _ip(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def prepare_host() -> None:
    """The bridge with GATEWAY before anything binds to it, forwarding on, bridged traffic through
    iptables (NetworkPolicies between pods on one bridge are enforced only then)."""
    if _ip("link", "show", BRIDGE, check=False).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge")
    net = ipaddress.ip_network(POD_CIDR)
    _ip("addr", "replace", f"{GATEWAY}/{net.prefixlen}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    with contextlib.suppress(OSError):
        Path("/proc/sys/net/bridge/bridge-nf-call-iptables").write_text("1\n")


def stop_containers(ctr: Path, run: Path) -> None:
    """Kill every container of the k8s.io namespace through containerd (which must still run)."""
    sock = containerd_socket(run)
    if not (ctr.exists() and sock.exists()):
        return
    for task in _ctr(ctr, sock, "tasks", "ls", "-q", check=False, timeout=30).stdout.split():
        _ctr(ctr, sock, "tasks", "kill", "--all", "-s", "SIGKILL", task, check=False, timeout=30)


def teardown_host(run: Path, kube_proxy: Path | None, log) -> None:
    """Undo what the node did to the machine; each step is best effort (a half-started node too).
    Containers left by a containerd that died are found in runc's state (the shim's default root)."""
    if RUNC_ROOT.is_dir():
        for c in RUNC_ROOT.iterdir():
            subprocess.run(["runc", "--root", str(RUNC_ROOT), "delete", "--force", c.name],
                           capture_output=True, timeout=30)
    unmount_under(node_dir(run))
    for ns in Path("/var/run/netns").glob("cni-*") if Path("/var/run/netns").exists() else ():
        subprocess.run(["ip", "netns", "delete", ns.name], capture_output=True, timeout=30)
    if kube_proxy and kube_proxy.exists():
        subprocess.run([str(kube_proxy), "--cleanup"], capture_output=True, timeout=60)
    _flush_kube_chains()
    _ip("link", "delete", BRIDGE, check=False)
    log("down: real node's containers, mounts, bridge and packet filter rules removed")


def unmount_under(root: Path) -> None:
    """Unmount every mount below root, deepest first (pod volumes, rootfs overlays, netns)."""
    prefix = str(root.resolve()) + "/"
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp.startswith(prefix):
                mounts.append(mp)
    for mp in sorted(set(mounts), key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30)


def _flush_kube_chains() -> None:
    """The KUBE-* chains left in the filter, nat and mangle tables, and the rules jumping to them:
    kube-router's (KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*), the kubelet's (KUBE-FIREWALL,
    KUBE-KUBELET-CANARY) and whatever `kube-proxy --cleanup` left; then kube-router's ipsets."""
    for table in ("filter", "nat", "mangle"):
        save = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True, timeout=30).stdout
        chains = [ln[1:].split()[0] for ln in save.splitlines() if ln.startswith(":KUBE-")]
        for ln in save.splitlines():
            if ln.startswith("-A ") and any(f"-j {c}" in ln for c in chains):
                subprocess.run(["iptables", "-t", table, "-D", *shlex.split(ln)[1:]], capture_output=True, timeout=30)
        for flag in ("-F", "-X"):
            for c in chains:
                subprocess.run(["iptables", "-t", table, flag, c], capture_output=True, timeout=30)
    sets = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, timeout=30).stdout.split()
    for s in sets:
        if s.startswith(("KUBE-", "kube-router")):
            subprocess.run(["ipset", "destroy", s], capture_output=True, timeout=30)


def _ctr(ctr: Path, sock: Path, *args, check=True, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([str(ctr), "--address", str(sock), "--namespace", "k8s.io", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, check=check)


def import_image(ctr: Path, run: Path, archive: Path) -> None:
    """Load an OCI archive into containerd's k8s.io namespace, unpacked for the kubelet."""
    _ctr(ctr, containerd_socket(run), "images", "import", str(archive))


def tag_image(ctr: Path, run: Path, ref: str, name: str) -> None:
    """Give an imported image another name, as a push to a registry and a pull from it would:
    a pod naming ``name`` (imagePullPolicy IfNotPresent) runs it."""
    _ctr(ctr, containerd_socket(run), "images", "tag", "--force", ref, name)


def untag_image(ctr: Path, run: Path, name: str) -> None:
    _ctr(ctr, containerd_socket(run), "images", "rm", name, check=False)




# ---------------------------------------------------------------------------------------------
# Start
# ---------------------------------------------------------------------------------------------
def start(c, state: dict, pki, images: dict, left) -> None:
    """Start containerd, kube-proxy, CoreDNS, kube-router and the kubelet; wait for the node Ready.

    c is hack/cluster/cluster.py (its _spawn, kubectl, PKI and binaries); images maps an image name
    to (archive, ref) from hack/images; left() is the seconds left of `up`'s budget."""
    run, ports, d = c.RUN, state["ports"], node_dir(c.RUN)
    t0 = time.monotonic()
    for sub in ("pki", "cni", "ipam", "containerd", "kubelet"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    prepare_host()
    ca_pem = pki.ca_crt.read_bytes()
    server = c._apiserver_url(ports)
    for ident, cn, orgs in (("kubelet", f"system:node:{REAL_NODE}", ["system:nodes"]),
                            ("kube-proxy", "system:kube-proxy", []),
                            ("coredns", "system:coredns", []),
                            ("kube-router", "system:kube-router", [])):
        crt, key = pki.issue(d / f"pki/{ident}.crt", d / f"pki/{ident}.key", cn, orgs, client=True)
        c.write_kubeconfig(d / f"{ident}.kubeconfig", server, ca_pem, crt, key, cn)
    pki.issue(d / "pki/kubelet-serving.crt", d / "pki/kubelet-serving.key", REAL_NODE,
              hosts=(GATEWAY, REAL_NODE), server=True)
    c.apply_objects(rbac_objects() + [apiserver_endpoint(ports["apiserver"])])
    (d / "resolv.conf").write_text(f"nameserver {GATEWAY}\n")  # what pods with dnsPolicy Default get

    # -- containerd, then the images the node's pods run
    ctd = c.own_module_binary("containerd")
    sandbox = images["pause"][1]
    (d / "containerd/config.toml").write_text(containerd_config(run, sandbox))
    (d / "cni/10-trainjob-admission.conflist").write_text(json.dumps(cni_config(run), indent=1))
    c._spawn(state, "containerd", [ctd / "containerd", f"--config={d / 'containerd/config.toml'}"],
             env={"PATH": f"{ctd}:{os.environ.get('PATH', '')}"})
    c._wait("containerd's socket", lambda: (c._check_running(state), containerd_socket(run).exists())[1], left())
    for name, (archive, _ref) in images.items():
        import_image(ctd / "ctr", run, archive)
    c.log(f"up: containerd ready, {len(images)} images imported ({time.monotonic() - t0:.1f} s)")

    # -- kube-proxy and CoreDNS (and kube-router below): host processes, as their DaemonSets run them
    (d / "kube-proxy.yaml").write_text(json.dumps(kube_proxy_config(run, ports)))
    c._spawn(state, "kube-proxy", [c.binary("kube-proxy"), f"--config={d / 'kube-proxy.yaml'}", "--v=1"])
    (d / "Corefile").write_text(corefile(run, ports))
    c._spawn(state, "coredns", [c.own_module_binary("coredns"), "-conf", d / "Corefile"])

    # -- the kubelet
    (d / "kubelet.yaml").write_text(json.dumps(kubelet_config(run, ports, pki.ca_crt)))
    c._spawn(state, "kubelet", [
        c.binary("kubelet"), f"--config={d / 'kubelet.yaml'}", f"--kubeconfig={d / 'kubelet.kubeconfig'}",
        f"--root-dir={d / 'kubelet'}", f"--hostname-override={REAL_NODE}", f"--node-ip={GATEWAY}",
        f"--node-labels={LABEL[0]}={LABEL[1]}", "--v=1"])

    def ready() -> bool:
        c._check_running(state)
        out = c.kubectl("get", "node", REAL_NODE, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        conds = json.loads(out.stdout)["status"].get("conditions", [])
        return any(x["type"] == "Ready" and x["status"] == "True" for x in conds)
    c._wait(f"node {REAL_NODE} Ready", ready, left(), interval=0.5)
    # kube-router finds its node object at start, so it starts once the kubelet registered it
    c._spawn(state, "kube-router", [
        c.own_module_binary("kube-router"), f"--kubeconfig={d / 'kube-router.kubeconfig'}",
        f"--hostname-override={REAL_NODE}", "--run-firewall=true", "--run-router=false",
        "--run-service-proxy=false", "--enable-cni=false",
        f"--service-cluster-ip-range={c.SERVICE_CIDR}",
        f"--health-port={ports['kube-router-health']}", "--v=1"],
        env={"NODE_NAME": REAL_NODE})  # else it looks the node up by the machine's hostname first
    c._wait("kube-router's health", lambda: (c._check_running(state), c._get(
        f"http://127.0.0.1:{ports['kube-router-health']}/healthz")[0] == 200)[1], left())
    state["real_node"] = {"name": REAL_NODE, "gateway": GATEWAY, "pod_cidr": POD_CIDR,
                          "images": {n: ref for n, (_a, ref) in images.items()},
                          "placement": PLACEMENT}
    c._save_state(state)
    c.log(f"up: real node {REAL_NODE} Ready ({time.monotonic() - t0:.1f} s)")
