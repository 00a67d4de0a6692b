#!/usr/bin/env python3
"""torch's own --numa-binding answer for an hwloc XML topology: runs the functions of
torch/numa/binding.py (torch 2.x) with their sysfs and CUDA readers replaced by what the XML
says, and prints one line per (mode, device): `MODE DEVICE CPULIST`, or `MODE DEVICE error: ...`.

    python3 torch_binding_oracle.py TOPOLOGY.xml

Used to make (and check) the exact CPU sets tests/launcher/numa_binding_test.cc expects. The
devices are the XML's NVIDIA GPUs (PCI class 03xx, vendor 10de) in bus order; every CPU is
allowed. Only the readers are replaced; the mode logic is torch's.
"""
import sys
import xml.etree.ElementTree as ET

import torch.numa.binding as b


def bits(mask):
    value = int(mask.replace(",", "").replace("0x", ""), 16) if mask else 0
    return {i for i in range(value.bit_length()) if value >> i & 1}


def load(path):
    root = ET.parse(path).getroot()
    parent = {}
    for p in root.iter():
        for c in p:
            parent[c] = p
    objs = [o for o in root.iter("object")]

    def ancestors(o):
        while o in parent:
            o = parent[o]
            yield o

    pus = {int(o.get("os_index")): o for o in objs if o.get("type") == "PU"}
    numa = {int(o.get("os_index")): bits(o.get("cpuset")) for o in objs
            if o.get("type") == "NUMANode"}
    core_of, cache_of, package_of = {}, {}, {}
    for idx, pu in pus.items():
        for a in ancestors(pu):
            t = a.get("type")
            if t == "Core" and idx not in core_of:
                core_of[idx] = bits(a.get("complete_cpuset"))
            if t == "L3Cache" and idx not in cache_of:
                cache_of[idx] = bits(a.get("complete_cpuset"))
            if t == "Package" and idx not in package_of:
                package_of[idx] = int(a.get("os_index"))
    gpus = []
    for o in objs:
        if o.get("type") != "PCIDev":
            continue
        cls, ids = o.get("pci_type").split()[:2]
        if not cls.startswith("03") or not ids.startswith("[10de"):
            continue
        for a in ancestors(o):
            if a.get("nodeset"):
                gpus.append((o.get("pci_busid"), min(bits(a.get("nodeset")))))
                break
    gpus.sort()
    return numa, core_of, cache_of, package_of, gpus


def main():
    numa, core_of, cache_of, package_of, gpus = load(sys.argv[1])
    b._get_cpu_indices_for_numa_node_MAYBE_NOT_ALLOWED = lambda *, numa_node_index: set(
        numa[numa_node_index])
    b._get_allowed_cpu_indices_for_current_thread = lambda: set(core_of)
    b._get_device_count = lambda: len(gpus)
    b._get_numa_node_index_for_device_index = lambda *, device_index: gpus[device_index][1]
    b._get_logical_cpu_indices_sharing_same_physical_core_as = (
        lambda *, logical_cpu_index: core_of[logical_cpu_index])
    b._get_logical_cpus_sharing_same_max_level_cache_as = (
        lambda *, logical_cpu_index: cache_of[logical_cpu_index])
    b._get_socket_index_for_cpu = lambda *, cpu_index: package_of[cpu_index]
    b._get_systemwide_numa_node_indices = lambda: set(numa)
    for mode in b.AffinityMode:
        for device in range(len(gpus)):
            try:
                cpus = b._get_logical_cpus_to_bind_to(
                    device_index=device, numa_options=b.NumaOptions(affinity_mode=mode))
                print(mode.value, device, b._get_ranges_str_from_ints(cpus))
            except Exception as e:  # noqa: BLE001 - the answer is the error
                print(mode.value, device, "error:", e)


main()
