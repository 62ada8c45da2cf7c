"""The real node's configuration (hack/cluster/realnode.py) as the programs will read it."""
from __future__ import annotations

import importlib.util
import ipaddress
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("trainjob_realnode", REPO / "hack" / "cluster" / "realnode.py")
realnode = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("trainjob_realnode", realnode)
_spec.loader.exec_module(realnode)

PORTS = {"kubelet": 1, "kubelet-healthz": 2, "kube-proxy-metrics": 3, "kube-proxy-healthz": 4,
         "coredns-health": 5, "coredns-ready": 6, "kube-router-health": 7, "apiserver": 8}


def test_containerd_config_is_toml_with_our_socket_sandbox_and_runc(tmp_path):
    cfg = tomllib.loads(realnode.containerd_config(tmp_path, "localhost/x/pause:1"))
    assert cfg["version"] == 3
    assert cfg["grpc"]["address"] == str(realnode.containerd_socket(tmp_path))
    assert len(cfg["grpc"]["address"]) < 108  # a unix socket path longer than sun_path cannot be bound
    plugins = cfg["plugins"]
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "localhost/x/pause:1"
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"BinaryName": "/usr/sbin/runc", "SystemdCgroup": False}
    assert runtime["cni"]["conf_dir"] == str(realnode.node_dir(tmp_path) / "cni")


def test_network_addresses_agree(tmp_path):
    cni = realnode.cni_config(tmp_path)
    (rng,) = cni["plugins"][0]["ipam"]["ranges"]
    assert rng == [{"subnet": realnode.POD_CIDR, "gateway": realnode.GATEWAY}]
    assert ipaddress.ip_address(realnode.GATEWAY) in ipaddress.ip_network(realnode.POD_CIDR)
    kubelet = realnode.kubelet_config(tmp_path, PORTS, tmp_path / "ca.crt")
    assert kubelet["clusterDNS"] == [realnode.GATEWAY] and kubelet["address"] == realnode.GATEWAY
    assert f"bind {realnode.GATEWAY}" in realnode.corefile(tmp_path, PORTS)
    assert realnode.kube_proxy_config(tmp_path, PORTS)["clusterCIDR"] == realnode.POD_CIDR
    slice_ = realnode.apiserver_endpoint(PORTS["apiserver"])
    assert slice_["endpoints"][0]["addresses"] == [realnode.GATEWAY] and slice_["ports"][0]["port"] == 8


def test_kubelet_runs_on_cgroups_v1_and_taints_the_node(tmp_path):
    kubelet = realnode.kubelet_config(tmp_path, PORTS, tmp_path / "ca.crt")
    assert kubelet["failCgroupV1"] is False and kubelet["cgroupDriver"] == "cgroupfs"
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    assert kubelet["authorization"]["mode"] == "Webhook" and kubelet["readOnlyPort"] == 0
    (taint,) = kubelet["registerWithTaints"]
    (toleration,) = realnode.PLACEMENT["tolerations"]
    assert (toleration["key"], toleration["value"], toleration["effect"]) == (taint["key"], taint["value"], taint["effect"])
    assert realnode.PLACEMENT["nodeSelector"] == {realnode.LABEL[0]: realnode.LABEL[1]}


def test_host_processes_only_read_what_they_need():
    roles = {o["metadata"]["name"]: o for o in realnode.rbac_objects() if o["kind"] == "ClusterRole"}
    writes = {(r, v) for name, role in roles.items() for rule in role["rules"] for r in rule["resources"]
              for v in rule["verbs"] if v not in ("get", "list", "watch")}
    assert writes == {("events", "create"), ("events", "patch")}  # kube-router's events only
