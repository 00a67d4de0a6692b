#!/usr/bin/env python3
"""Writes the hwloc v2 XML topologies of the GPU nodes that tests/launcher/numa_binding_test.cc
plans --numa-binding on (see README.md here for what each node is modelled on).

Run it from this directory after changing a description; the XML files are checked in, and
`lstopo-no-graphics -i FILE` (hwloc-nox) loads each of them. Only what the binding reads is
written: packages, NUMA nodes (with the Group hwloc inserts when a package holds several), L3
caches, cores and PUs with the OS's numbering, and the PCI tree (host bridges, switches, GPUs,
NICs with their OS devices). L1/L2 caches and PCI link speeds are left out.
"""
import itertools
from xml.sax.saxutils import quoteattr

gp = itertools.count(1)


def mask(bits):
    bits = sorted(set(bits))
    if not bits:
        return "0x0"
    words = [0] * (bits[-1] // 32 + 1)
    for b in bits:
        words[b // 32] |= 1 << (b % 32)
    return ",".join("0x%08x" % w for w in reversed(words))


def sets(cpus, nodes):
    return ('cpuset="%s" complete_cpuset="%s" nodeset="%s" complete_nodeset="%s"'
            % (mask(cpus), mask(cpus), mask(nodes), mask(nodes)))


class Out:
    def __init__(self):
        self.lines = []

    def add(self, depth, text):
        self.lines.append("  " * depth + text)


def pci(out, d, busid, cls, vendor, device, osdevs):
    out.add(d, '<object type="PCIDev" gp_index="%d" pci_busid="%s" pci_type="%04x [%04x:%04x] '
               '[%04x:%04x] 00">' % (next(gp), busid, cls, vendor, device, vendor, 0))
    for name, kind in osdevs:
        out.add(d + 1, '<object type="OSDev" gp_index="%d" name=%s osdev_type="%d"/>'
                % (next(gp), quoteattr(name), kind))
    out.add(d, "</object>")


NVIDIA, MELLANOX, INTEL = 0x10de, 0x15b3, 0x8086
GPU_CLASS, ETH_CLASS, IB_CLASS = 0x0302, 0x0200, 0x0207
OSDEV_NETWORK, OSDEV_OPENFABRICS = 2, 3


def io_tree(out, d, switch):
    """switch: (first_bus, last_bus, [(bus, kind, name...)...], [sub-switches...]) as a host
    bridge over one PCIe switch whose downstream ports each hold one device."""
    lo, hi, devices = switch
    out.add(d, '<object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" '
               'bridge_pci="0000:[%02x-%02x]">' % (next(gp), lo, hi))
    out.add(d + 1, '<object type="Bridge" gp_index="%d" pci_busid="0000:%02x:00.0" '
                   'pci_type="0604 [1000:c030] [1000:0000] b0" bridge_type="1-1" depth="1" '
                   'bridge_pci="0000:[%02x-%02x]">' % (next(gp), lo, lo + 1, hi))
    for group in devices:  # each group shares one downstream port (a second-level switch)
        first = min(int(dev[0][5:7], 16) for dev in group)
        last = max(int(dev[0][5:7], 16) for dev in group)
        out.add(d + 2, '<object type="Bridge" gp_index="%d" pci_busid="0000:%02x:00.0" '
                       'pci_type="0604 [1000:c030] [1000:0000] b0" bridge_type="1-1" depth="2" '
                       'bridge_pci="0000:[%02x-%02x]">' % (next(gp), first - 1, first, last))
        for busid, kind, *names in group:
            if kind == "gpu":
                pci(out, d + 3, busid, GPU_CLASS, NVIDIA, names[0], [])
            elif kind == "ib":
                pci(out, d + 3, busid, IB_CLASS, MELLANOX, 0x1021,
                    [(names[0], OSDEV_NETWORK), (names[1], OSDEV_OPENFABRICS)])
            else:
                pci(out, d + 3, busid, ETH_CLASS, MELLANOX, 0x101d, [(names[0], OSDEV_NETWORK)])
        out.add(d + 2, "</object>")
    out.add(d + 1, "</object>")
    out.add(d, "</object>")


def cores(out, d, core_ids, pu_of):
    for c in core_ids:
        pus = pu_of(c)
        out.add(d, '<object type="Core" os_index="%d" %s gp_index="%d">'
                % (c, sets(pus, []), next(gp)))
        for p in pus:
            out.add(d + 1, '<object type="PU" os_index="%d" %s gp_index="%d"/>'
                    % (p, sets([p], []), next(gp)))
        out.add(d, "</object>")


def topology(name, packages, numa_per_package, cores_per_l3, cores_per_package, threads,
             l3_size, memory_per_numa, vendor, model, io_by_numa):
    """Numbering as Linux gives it on these machines: cores 0..N-1 across the packages in
    order, then their second threads N..2N-1."""
    global gp
    gp = itertools.count(1)
    total_cores = packages * cores_per_package
    pu_of = lambda c: [c + t * total_cores for t in range(threads)]
    cpus_of = lambda cs: [p for c in cs for p in pu_of(c)]
    out = Out()
    out.add(0, '<?xml version="1.0" encoding="UTF-8"?>')
    out.add(0, '<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
    out.add(0, '<topology version="2.0">')
    all_nodes = list(range(packages * numa_per_package))
    all_cpus = cpus_of(range(total_cores))
    out.add(1, '<object type="Machine" os_index="0" %s allowed_cpuset="%s" allowed_nodeset="%s" '
               'gp_index="%d">' % (sets(all_cpus, all_nodes), mask(all_cpus), mask(all_nodes),
                                   next(gp)))
    out.add(2, '<info name="Backend" value="Linux"/>')
    out.add(2, '<info name="Architecture" value="x86_64"/>')
    out.add(2, '<info name="HostName" value=%s/>' % quoteattr(name))
    cores_per_numa = cores_per_package // numa_per_package
    for pkg in range(packages):
        pkg_cores = range(pkg * cores_per_package, (pkg + 1) * cores_per_package)
        pkg_nodes = [pkg * numa_per_package + i for i in range(numa_per_package)]
        out.add(2, '<object type="Package" os_index="%d" %s gp_index="%d">'
                % (pkg, sets(cpus_of(pkg_cores), pkg_nodes), next(gp)))
        out.add(3, '<info name="CPUVendor" value=%s/>' % quoteattr(vendor))
        out.add(3, '<info name="CPUModel" value=%s/>' % quoteattr(model))
        for n in pkg_nodes:
            node_cores = range(n * cores_per_numa, (n + 1) * cores_per_numa)
            d = 3
            if numa_per_package > 1:  # hwloc's Group holding the NUMA node's CPUs
                out.add(3, '<object type="Group" %s gp_index="%d" kind="1000" dont_merge="0">'
                        % (sets(cpus_of(node_cores), [n]), next(gp)))
                d = 4
            out.add(d, '<object type="NUMANode" os_index="%d" %s gp_index="%d" '
                       'local_memory="%d"/>' % (n, sets(cpus_of(node_cores), [n]), next(gp),
                                                memory_per_numa))
            for l3 in range(0, cores_per_numa, cores_per_l3):
                l3_cores = node_cores[l3:l3 + cores_per_l3]
                out.add(d, '<object type="L3Cache" os_index="%d" %s gp_index="%d" '
                           'cache_size="%d" depth="3" cache_linesize="64" '
                           'cache_associativity="16" cache_type="0">'
                        % (l3_cores[0] // cores_per_l3, sets(cpus_of(l3_cores), [n]), next(gp),
                           l3_size))
                cores(out, d + 1, l3_cores, pu_of)
                out.add(d, "</object>")
            if numa_per_package > 1:
                for sw in io_by_numa.get(n, []):
                    io_tree(out, d, sw)
                out.add(3, "</object>")
        if numa_per_package == 1:
            for sw in io_by_numa.get(pkg, []):
                io_tree(out, 3, sw)
        out.add(2, "</object>")
    out.add(1, "</object>")
    out.add(0, "</topology>")
    with open(name + ".xml", "w") as f:
        f.write("\n".join(out.lines) + "\n")


H100, A100_SXM, A100_PCIE = 0x2330, 0x20b2, 0x20b5

# 8 GPUs on 2 sockets, one NIC per GPU pair: DGX H100's CPUs (2x Xeon Platinum 8480C, 56
# cores, 2 threads, one NUMA node per socket) and GPU bus ids, with four ConnectX-7 (one per
# PCIe switch, shared by the switch's two GPUs) as HGX H100 builds with 4 compute NICs have.
topology(
    "dgx-h100-like-2s-8gpu", packages=2, numa_per_package=1, cores_per_l3=56,
    cores_per_package=56, threads=2, l3_size=105 * 2**20, memory_per_numa=1 << 40,
    vendor="GenuineIntel", model="Intel(R) Xeon(R) Platinum 8480C",
    io_by_numa={
        0: [(0x15, 0x45, [[("0000:18:00.0", "ib", "ibp24s0", "mlx5_0"),
                           ("0000:1b:00.0", "gpu", H100)],
                          [("0000:43:00.0", "gpu", H100)]]),
            (0x4c, 0x62, [[("0000:4f:00.0", "ib", "ibp79s0", "mlx5_1"),
                           ("0000:52:00.0", "gpu", H100)],
                          [("0000:61:00.0", "gpu", H100)]])],
        1: [(0x97, 0xc4, [[("0000:9a:00.0", "ib", "ibp154s0", "mlx5_2"),
                           ("0000:9d:00.0", "gpu", H100)],
                          [("0000:c3:00.0", "gpu", H100)]]),
            (0xcb, 0xe0, [[("0000:ce:00.0", "ib", "ibp206s0", "mlx5_3"),
                           ("0000:d1:00.0", "gpu", H100)],
                          [("0000:df:00.0", "gpu", H100)]])],
    })

# 4 GPUs on one socket: a single Xeon Gold 6338 (32 cores, 2 threads, one NUMA node, one L3)
# with four A100 PCIe GPUs on their own root ports and one 100GbE ConnectX-6 Dx.
topology(
    "xeon-1s-4gpu", packages=1, numa_per_package=1, cores_per_l3=32, cores_per_package=32,
    threads=2, l3_size=48 * 2**20, memory_per_numa=512 << 30,
    vendor="GenuineIntel", model="Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz",
    io_by_numa={
        0: [(0x16, 0x18, [[("0000:17:00.0", "gpu", A100_PCIE)]]),
            (0x30, 0x32, [[("0000:31:00.0", "gpu", A100_PCIE)],
                          [("0000:32:00.0", "eth", "ens2f0np0")]]),
            (0xb0, 0xb1, [[("0000:b1:00.0", "gpu", A100_PCIE)]]),
            (0xc9, 0xca, [[("0000:ca:00.0", "gpu", A100_PCIE)]])],
    })

# Many core complexes: DGX A100 (2x AMD EPYC 7742, 64 cores, 2 threads, NPS4: 4 NUMA nodes per
# socket, a 16 MB L3 per 4-core CCX, so 4 CCXs per NUMA node), its GPU bus ids and NUMA
# affinity (GPU 0,1: NUMA 3; 2,3: NUMA 1; 4,5: NUMA 7; 6,7: NUMA 5), and one ConnectX-6 per GPU
# sharing that GPU's switch port (mlx5_0..3, 6..9).
topology(
    "dgx-a100-like-2s-epyc-nps4", packages=2, numa_per_package=4, cores_per_l3=4,
    cores_per_package=64, threads=2, l3_size=16 * 2**20, memory_per_numa=128 << 30,
    vendor="AuthenticAMD", model="AMD EPYC 7742 64-Core Processor",
    io_by_numa={
        3: [(0x05, 0x13, [[("0000:07:00.0", "gpu", A100_SXM),
                           ("0000:0c:00.0", "ib", "ibp12s0", "mlx5_0")],
                          [("0000:0f:00.0", "gpu", A100_SXM),
                           ("0000:12:00.0", "ib", "ibp18s0", "mlx5_1")]])],
        1: [(0x45, 0x55, [[("0000:47:00.0", "gpu", A100_SXM),
                           ("0000:4b:00.0", "ib", "ibp75s0", "mlx5_2")],
                          [("0000:4e:00.0", "gpu", A100_SXM),
                           ("0000:54:00.0", "ib", "ibp84s0", "mlx5_3")]])],
        7: [(0x85, 0x95, [[("0000:87:00.0", "gpu", A100_SXM),
                           ("0000:8d:00.0", "ib", "ibp141s0", "mlx5_6")],
                          [("0000:90:00.0", "gpu", A100_SXM),
                           ("0000:94:00.0", "ib", "ibp148s0", "mlx5_7")]])],
        5: [(0xb5, 0xcd, [[("0000:b7:00.0", "gpu", A100_SXM),
                           ("0000:ba:00.0", "ib", "ibp186s0", "mlx5_8")],
                          [("0000:bd:00.0", "gpu", A100_SXM),
                           ("0000:cc:00.0", "ib", "ibp204s0", "mlx5_9")]])],
    })
