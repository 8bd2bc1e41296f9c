#!/usr/bin/env python3
"""Writes the recorded machines of tests/topology/data/ as hwloc 2 XML (what `lstopo --of xml`
writes, reduced to packages, NUMA nodes, cores, PUs and the PCIe tree of GPUs and NICs).

    tests/topology/make_machines.py [OUTPUT_DIR]       (default: tests/topology/data)

The machines are written from public descriptions, not recorded on the hardware:
  dgx-h100.xml      2 sockets x 56 cores (2 PUs each), 8 H100 GPUs and 8 ConnectX-7 compute NICs
                    behind 4 PCIe switches (2 GPUs + 2 NICs each; each GPU shares a second-level
                    switch with one NIC), 2 storage NICs on their own host bridges
  gpu4-nic2.xml     1 socket x 32 cores, 4 GPUs and 2 NICs behind 2 switches (2 GPUs + 1 NIC)
  cpu-only.xml      2 sockets x 16 cores, no GPU, one Ethernet NIC per socket
  nics-socket0.xml  2 sockets x 32 cores, 8 GPUs (4 per socket), both NICs on socket 0
  mini-2socket.xml  2 sockets x 1 core (CPUs 0 and 2, 1 and 3), one NIC per socket: a machine
                    whose NIC cores a 2-CPU test machine has (transport.proxy_cpus = auto)
and two sysfs trees of the DGX-like node for the pre-flight check (strata-info --check):
  sysfs-dgx-acs/    ACS P2P redirect on the switch above GPU 0 and mlx5_0, the IOMMU in
                    translated mode (DMA-FQ) for GPU 0 and mlx5_0
  sysfs-dgx-clean/  ACS present but not redirecting, the IOMMU in passthrough (identity)
(bus/pci/devices/BDF/config with an ACS extended capability for every bridge, and
kernel/iommu_groups/N/type with the devices' iommu_group links), and
  proc-dgx/         the NVIDIA driver's driver/nvidia/gpus/BDF/information of its 8 GPUs (UUIDs
                    made up), where CUDA_VISIBLE_DEVICES=GPU-<uuid> entries are resolved.
The test suite (test_topology.cpp) checks each rank's NIC, cores and NUMA node on these.
"""

import os
import sys


def bitmap(indexes):
    """hwloc's XML bitmap: 32-bit words, most significant first."""
    if not indexes:
        return '0x0'
    words = [0] * (max(indexes) // 32 + 1)
    for i in indexes:
        words[i // 32] |= 1 << (i % 32)
    return ','.join('0x%08x' % w for w in reversed(words))


class Writer:
    def __init__(self):
        self.lines = []
        self.gp = 0

    def gp_index(self):
        self.gp += 1
        return self.gp

    def open(self, depth, attrs, close=False):
        text = ' '.join('%s="%s"' % kv for kv in attrs)
        self.lines.append('%s<object %s%s>' % ('  ' * depth, text, '/' if close else ''))

    def close(self, depth):
        self.lines.append('%s</object>' % ('  ' * depth))


def cpu_attrs(pus, nodes):
    return [('cpuset', bitmap(pus)), ('complete_cpuset', bitmap(pus)),
            ('nodeset', bitmap(nodes)), ('complete_nodeset', bitmap(nodes))]


# PCI devices: (class, vendor, device, subvendor, subdevice, revision)
H100 = ('0302', '10de', '2330', '10de', '16c1', 'a1')
CX7 = ('0207', '15b3', '1021', '15b3', '0041', '00')
E810 = ('0200', '8086', '1593', '8086', '0002', '02')
PEX = ('0604', '1000', 'c030', '0000', '0000', '00')
ROOT = ('0604', '8086', '352a', '0000', '0000', '04')


def pci_type(t):
    return '%s [%s:%s] [%s:%s] %s' % t


class Pci:
    """A PCIe tree under one host bridge: bus numbers given depth first."""

    def __init__(self, w, root_bus):
        self.w = w
        self.next_bus = root_bus + 1
        self.root_bus = root_bus

    def subtree_buses(self, node):
        if node[0] != 'bridge':
            return 0
        return 1 + sum(self.subtree_buses(c) for c in node[1])

    def emit(self, node, depth, bus, dev, bridge_depth):
        w = self.w
        busid = '0000:%02x:%02x.0' % (bus, dev)
        kind = node[0]
        if kind == 'bridge':
            secondary = self.next_bus
            self.next_bus += 1
            subordinate = secondary + self.subtree_buses(node) - 1
            ident = node[2] if len(node) > 2 else PEX
            w.open(depth, [('type', 'Bridge'), ('gp_index', w.gp_index()), ('bridge_type', '1-1'),
                           ('depth', bridge_depth),
                           ('bridge_pci', '0000:[%02x-%02x]' % (secondary, subordinate)),
                           ('pci_busid', busid), ('pci_type', pci_type(ident)),
                           ('pci_link_speed', '31.507692')])
            for i, child in enumerate(node[1]):
                self.emit(child, depth + 1, secondary, i, bridge_depth + 1)
            w.close(depth)
        elif kind == 'gpu':
            w.open(depth, [('type', 'PCIDev'), ('gp_index', w.gp_index()), ('pci_busid', busid),
                           ('pci_type', pci_type(H100)), ('pci_link_speed', '63.015385')])
            w.open(depth + 1, [('type', 'OSDev'), ('gp_index', w.gp_index()),
                               ('name', 'cuda%d' % node[1]), ('subtype', 'CUDA'),
                               ('osdev_type', '5')], close=True)
            w.close(depth)
        elif kind == 'nic':
            ident = node[3] if len(node) > 3 else CX7
            w.open(depth, [('type', 'PCIDev'), ('gp_index', w.gp_index()), ('pci_busid', busid),
                           ('pci_type', pci_type(ident)), ('pci_link_speed', '63.015385')])
            if node[2]:  # network interface
                w.open(depth + 1, [('type', 'OSDev'), ('gp_index', w.gp_index()),
                                   ('name', node[2]), ('osdev_type', '2')], close=True)
            if node[1]:  # OpenFabrics device
                w.open(depth + 1, [('type', 'OSDev'), ('gp_index', w.gp_index()),
                                   ('name', node[1]), ('subtype', 'OpenFabrics'),
                                   ('osdev_type', '3')], close=True)
            w.close(depth)

    def host_bridge(self, depth, children):
        w = self.w
        last = self.next_bus - 1 + sum(self.subtree_buses(c) for c in children)
        w.open(depth, [('type', 'Bridge'), ('gp_index', w.gp_index()), ('bridge_type', '0-1'),
                       ('depth', '0'),
                       ('bridge_pci', '0000:[%02x-%02x]' % (self.root_bus, max(last,
                                                                                self.root_bus)))])
        for i, child in enumerate(children):
            self.emit(child, depth + 1, self.root_bus, i + 1, 1)
        w.close(depth)


def machine(name, packages, cores_per_package, io_per_package):
    """io_per_package[p]: list of (root_bus, [tree nodes]) host bridges of package p."""
    w = Writer()
    pus_per_package = cores_per_package * 2
    total_cores = cores_per_package * packages
    all_pus = list(range(total_cores * 2))

    def pus_of(p):
        # Linux numbers the first PU of every core first, then the siblings.
        first = list(range(p * cores_per_package, (p + 1) * cores_per_package))
        return first + [c + total_cores for c in first]

    w.lines.append('<?xml version="1.0" encoding="UTF-8"?>')
    w.lines.append('<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
    w.lines.append('<topology version="2.0">')
    w.open(1, [('type', 'Machine'), ('os_index', '0')] + cpu_attrs(all_pus, list(range(packages)))
           + [('allowed_cpuset', bitmap(all_pus)),
              ('allowed_nodeset', bitmap(list(range(packages)))), ('gp_index', w.gp_index())])
    w.lines.append('    <info name="DMIProductName" value="%s (written by make_machines.py)"/>'
                   % name)
    for p in range(packages):
        pus = pus_of(p)
        w.open(2, [('type', 'Package'), ('os_index', p)] + cpu_attrs(pus, [p]) +
               [('gp_index', w.gp_index())])
        w.open(3, [('type', 'NUMANode'), ('os_index', p)] + cpu_attrs(pus, [p]) +
               [('gp_index', w.gp_index()), ('local_memory', str(1024 ** 4))], close=True)
        for c in range(cores_per_package):
            core = p * cores_per_package + c
            pair = [core, core + total_cores]
            w.open(3, [('type', 'Core'), ('os_index', core)] + cpu_attrs(pair, [p]) +
                   [('gp_index', w.gp_index())])
            for pu in pair:
                w.open(4, [('type', 'PU'), ('os_index', pu)] + cpu_attrs([pu], [p]) +
                       [('gp_index', w.gp_index())], close=True)
            w.close(3)
        for root_bus, tree in io_per_package[p]:
            Pci(w, root_bus).host_bridge(3, tree)
        w.close(2)
    w.close(1)
    w.lines.append('</topology>')
    del pus_per_package
    return '\n'.join(w.lines) + '\n'


def bridge(*children, ident=PEX):
    return ('bridge', list(children), ident)


def gpu(i):
    return ('gpu', i)


def nic(rdma, net, ident=CX7):
    return ('nic', rdma, net, ident)


def dgx_h100():
    # Per switch s: the root port, the switch, and per GPU a second-level switch shared with
    # its NIC (GPU 2s <-> mlx5_2s: PIX; GPU 2s <-> mlx5_(2s+1): PXB).
    def switch(s, root_bus):
        a, b = 2 * s, 2 * s + 1
        return (root_bus, [bridge(bridge(
            bridge(bridge(gpu(a)), bridge(nic('mlx5_%d' % a, 'ibp%ds0' % (root_bus + 4)))),
            bridge(bridge(gpu(b)), bridge(nic('mlx5_%d' % b, 'ibp%ds0' % (root_bus + 9))))),
            ident=ROOT)])

    def storage(k, root_bus):
        return (root_bus, [bridge(nic('mlx5_%d' % (8 + k), 'enp%ds0np0' % (root_bus + 1)),
                                  ident=ROOT)])

    io = [[switch(0, 0x10), switch(1, 0x30), storage(0, 0x60)],
          [switch(2, 0x90), switch(3, 0xb0), storage(1, 0xe0)]]
    return machine('DGX H100', 2, 56, io)


def gpu4_nic2():
    def switch(s, root_bus):
        return (root_bus, [bridge(bridge(bridge(gpu(2 * s)), bridge(gpu(2 * s + 1)),
                                         bridge(nic('mlx5_%d' % s, 'ibp%ds0' % (root_bus + 5)))),
                                  ident=ROOT)])
    return machine('4 GPUs 2 NICs', 1, 32, [[switch(0, 0x10), switch(1, 0x40)]])


def cpu_only():
    io = [[(0x10, [bridge(nic(None, 'ens1f0', E810), ident=ROOT)])],
          [(0x80, [bridge(nic(None, 'ens2f0', E810), ident=ROOT)])]]
    return machine('CPU only', 2, 16, io)


def nics_socket0():
    def switch(s, root_bus, with_nic):
        kids = [bridge(gpu(2 * s)), bridge(gpu(2 * s + 1))]
        if with_nic:
            kids.append(bridge(nic('mlx5_%d' % s, 'ibp%ds0' % (root_bus + 5))))
        return (root_bus, [bridge(bridge(*kids), ident=ROOT)])
    io = [[switch(0, 0x10, True), switch(1, 0x30, True)],
          [switch(2, 0x90, False), switch(3, 0xb0, False)]]
    return machine('NICs on socket 0', 2, 32, io)


def mini_2socket():
    io = [[(0x10, [bridge(nic(None, 'ens1f0', E810), ident=ROOT)])],
          [(0x80, [bridge(nic(None, 'ens2f0', E810), ident=ROOT)])]]
    return machine('2 sockets of 1 core', 2, 1, io)


def write_sysfs(out, name, redirect_bridges, iommu_type):
    """A sysfs tree for the DGX-like node's GPU 0 / mlx5_0 corner: config spaces of the bridges
    between them (ACS control = redirect bits for those in redirect_bridges), IOMMU groups."""
    import struct
    root = os.path.join(out, name)
    bridges = ['0000:10:01.0', '0000:11:00.0', '0000:12:00.0', '0000:13:00.0', '0000:13:01.0']
    devices = {'0000:14:00.0': 0, '0000:15:00.0': 1}  # GPU 0, mlx5_0 -> IOMMU group
    for bdf in bridges:
        d = os.path.join(root, 'bus', 'pci', 'devices', bdf)
        os.makedirs(d, exist_ok=True)
        cfg = bytearray(4096)
        struct.pack_into('<HH', cfg, 0, 0x1000, 0xc030)
        # Extended capabilities: AER (0x0001) at 0x100 -> ACS (0x000d) at 0x148 -> end.
        struct.pack_into('<I', cfg, 0x100, 0x0001 | (1 << 16) | (0x148 << 20))
        control = 0x2c if bdf in redirect_bridges else 0x00
        struct.pack_into('<IHH', cfg, 0x148, 0x000d | (1 << 16), 0x007f, control)
        with open(os.path.join(d, 'config'), 'wb') as f:
            f.write(bytes(cfg))
    for bdf, group in devices.items():
        d = os.path.join(root, 'bus', 'pci', 'devices', bdf)
        os.makedirs(d, exist_ok=True)
        g = os.path.join(root, 'kernel', 'iommu_groups', str(group))
        os.makedirs(g, exist_ok=True)
        with open(os.path.join(g, 'type'), 'w') as f:
            f.write(iommu_type + '\n')
        link = os.path.join(d, 'iommu_group')
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.join('..', '..', '..', '..', 'kernel', 'iommu_groups', str(group)), link)


def dgx_gpu_uuid(i):
    """The made-up UUID of the DGX-like node's GPU i (proc-dgx/)."""
    return 'GPU-5a1e%04x-0b1d-4c3e-8f21-0000000000%02x' % (0x2b00 + i, i)


DGX_GPU_BUSES = ['0000:14:00.0', '0000:17:00.0', '0000:34:00.0', '0000:37:00.0',
                 '0000:94:00.0', '0000:97:00.0', '0000:b4:00.0', '0000:b7:00.0']


def write_proc(out, name):
    """/proc/driver/nvidia/gpus/BDF/information of the DGX-like node's GPUs, in the driver's
    layout (the fields strata reads: GPU UUID and Bus Location)."""
    for i, bdf in enumerate(DGX_GPU_BUSES):
        d = os.path.join(out, name, 'driver', 'nvidia', 'gpus', bdf)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, 'information'), 'w') as f:
            f.write('Model: \t\t NVIDIA H100 80GB HBM3\n'
                    'IRQ:   \t\t %d\n'
                    'GPU UUID: \t %s\n'
                    'Video BIOS: \t 96.00.74.00.0d\n'
                    'Bus Type: \t PCIe\n'
                    'DMA Size: \t 52 bits\n'
                    'DMA Mask: \t 0xfffffffffffff\n'
                    'Bus Location: \t %s\n'
                    'Device Minor: \t %d\n'
                    'GPU Excluded: \t No\n' % (200 + i, dgx_gpu_uuid(i), bdf, i))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'data')
    os.makedirs(out, exist_ok=True)
    for name, text in [('dgx-h100.xml', dgx_h100()), ('gpu4-nic2.xml', gpu4_nic2()),
                       ('cpu-only.xml', cpu_only()), ('nics-socket0.xml', nics_socket0()),
                       ('mini-2socket.xml', mini_2socket())]:
        with open(os.path.join(out, name), 'w') as f:
            f.write(text)
    write_sysfs(out, 'sysfs-dgx-acs', {'0000:12:00.0'}, 'DMA-FQ')
    write_sysfs(out, 'sysfs-dgx-clean', set(), 'identity')
    write_proc(out, 'proc-dgx')


if __name__ == '__main__':
    main()
